"""Registering the servicer of Triton's `inference.GRPCInferenceService`.

The generated `add_GRPCInferenceServiceServicer_to_server` has gRPC parse every request and
serialise every response on the event loop (57 ms each way for a 60 MiB message). This table
is built from the same service descriptor, with one difference: ModelInfer and
ModelStreamInfer take and give wire bytes, so the servicer parses and serialises them itself,
off the loop when they are large (protocol/offload.py). Every other method is parsed by
inferd too, before the servicer runs: a message gRPC could not parse would be answered
UNKNOWN naming a Python exception class, where a client sent bad bytes (INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from inferd.errors import invalid
from inferd.protocol.grpc.error_status import abort

SERVICE = "inference.GRPCInferenceService"
RAW_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})  # bytes in, bytes out


def method_handlers(servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        behaviour = getattr(servicer, method.name)
        serialize = None
        if method.name not in RAW_METHODS:
            behaviour = _parsing(behaviour, getattr(pb, method.input_type.name))
            serialize = getattr(pb, method.output_type.name).SerializeToString
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif not method.client_streaming and not method.server_streaming:
            make = grpc.unary_unary_rpc_method_handler
        else:  # the service has none of these; refuse to register it half-understood
            raise TypeError(f"{SERVICE}/{method.name}: unexpected streaming kind")
        handlers[method.name] = make(
            behaviour, request_deserializer=None, response_serializer=serialize
        )
    return handlers


def _parsing(
    behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], message: Any
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    """`behaviour`, taking the wire bytes of a `message` and parsing them first."""
    name = message.DESCRIPTOR.name

    async def parsed(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = message.FromString(raw)
        except DecodeError as exc:
            await abort(context, invalid(f"malformed {name}: {exc}"))
        return await behaviour(request, context)

    return parsed


def add_inference_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # As the generated code does (grpc >= 1.62): registered methods skip the generic lookup.
    register = getattr(server, "add_registered_method_handlers", None)
    if register is not None:
        register(SERVICE, handlers)
