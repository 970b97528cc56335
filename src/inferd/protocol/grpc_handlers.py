"""Registering the servicer of Triton's `inference.GRPCInferenceService`.

The generated `add_GRPCInferenceServiceServicer_to_server` has gRPC parse every request and
serialise every response on the event loop (57 ms each way for a 60 MiB message). This table
is built from the same service descriptor, with one difference: ModelInfer and
ModelStreamInfer take and give wire bytes, so the servicer parses and serialises them itself,
off the loop when they are large (protocol/offload.py). Every other method is as generated.
"""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
RAW_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})  # bytes in, bytes out


def method_handlers(servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        behaviour = getattr(servicer, method.name)
        if method.name in RAW_METHODS:
            parse, serialize = None, None
        else:
            parse = getattr(pb, method.input_type.name).FromString
            serialize = getattr(pb, method.output_type.name).SerializeToString
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif not method.client_streaming and not method.server_streaming:
            make = grpc.unary_unary_rpc_method_handler
        else:  # the service has none of these; refuse to register it half-understood
            raise TypeError(f"{SERVICE}/{method.name}: unexpected streaming kind")
        handlers[method.name] = make(
            behaviour, request_deserializer=parse, response_serializer=serialize
        )
    return handlers


def add_inference_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # As the generated code does (grpc >= 1.62): registered methods skip the generic lookup.
    register = getattr(server, "add_registered_method_handlers", None)
    if register is not None:
        register(SERVICE, handlers)
