"""gRPC `ModelInfer` over any `UnaryPlane`: the DataPlane in one process, the engine's client
in a front end of `--workers N --engine` (engine/front_end.py). And `errors_mapped`, the one
rule by which every servicer method answers a failure."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from inferd.dataplane.unary_plane import UnaryPlane
from inferd.errors import InferdError
from inferd.events import CallContext
from inferd.limits import Limits
from inferd.protocol.grpc.error_status import abort, abort_internal
from inferd.protocol.grpc.protobuf_codec import (
    decode_infer_request,
    parse_infer_request,
    serialize_infer_response,
)
from inferd.protocol.grpc.stream_infer import call_context
from inferd.protocol.offload import Offload
from inferd.telemetry import tracing
from inferd.types import min_wire_bytes

log = logging.getLogger("inferd.grpc")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Method = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def errors_mapped(method: Method[Req, Resp]) -> Method[Req, Resp]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await method(self, request, context)
        except InferdError as exc:
            await abort(context, exc)
        except Exception:
            log.exception("unhandled error in %s", method.__name__)
            await abort_internal(context)

    return wrapper


class ModelInferMethod:
    """`ModelInfer`, taking and giving wire bytes (handlers.py): parsing and serialising
    a large message happen here, off the event loop, not in gRPC on it."""

    def __init__(
        self, plane: UnaryPlane, limits: Limits, offload: Offload, max_response_bytes: int = 0
    ) -> None:
        self.plane = plane
        self.limits = limits
        self.offload = offload
        self.max_response_bytes = max_response_bytes

    @errors_mapped
    async def ModelInfer(self, request: bytes, context: Any) -> bytes:
        ctx = call_context(context)
        # Trailing metadata: sent with the response and with an error status alike.
        if ctx.traceparent and (traceparent := tracing.echo(ctx)):  # a valid one came in
            context.set_trailing_metadata((("traceparent", traceparent),))
        msg = await self.offload.run(len(request), parse_infer_request, request)
        return await self._infer(msg, len(request), ctx)

    async def _infer(self, msg: Any, size: int, ctx: CallContext) -> bytes:
        plane = self.plane
        with plane.start(msg.model_name, msg.model_version, ctx) as call:
            plane.admit(call)
            max_elements = self.limits.max_bytes_elements
            try:
                request = await self.offload.run(size, decode_infer_request, msg, max_elements)
            except InferdError as exc:  # admission first, as in one process
                raise await plane.refusal(call, exc) from None
            response = plane.respond(call, await plane.infer(call, request))
            return await self.offload.run(
                min_wire_bytes(response.outputs),
                serialize_infer_response,
                response,
                self.max_response_bytes,
            )
