"""A front end's gRPC methods other than ModelInfer: passed as wire bytes to the engine's own
gRPC server (the single server's servicer, on a unix socket), the answer, status, details
and trailing metadata passed back as they came.

ModelStreamInfer (streams, decoupled models) is proxied message by message in both
directions. While the engine is away every call fails UNAVAILABLE at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from inferd.engine.http_proxy import ENGINE_GONE

STREAM_METHODS = frozenset({"/inference.GRPCInferenceService/ModelStreamInfer"})
_RESERVED = (":", "grpc-")  # metadata gRPC sets itself


def engine_channel(path: Path, max_message_bytes: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"unix:{path}",
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # A restarted engine is found within 0.1-1 s, not gRPC's default of up to 2 min.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ],
    )


class GrpcProxy(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        if method in STREAM_METHODS:
            return grpc.stream_stream_rpc_method_handler(self._stream(method))
        return grpc.unary_unary_rpc_method_handler(self._unary(method))

    def _unary(self, method: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
        forward = self.channel.unary_unary(method)

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            call = forward(request, metadata=_metadata(context), timeout=context.time_remaining())
            try:
                response: bytes = await call
            except grpc.aio.AioRpcError as exc:
                await _abort(context, exc)
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
            return response

        return unary

    def _stream(self, method: str) -> Callable[[AsyncIterator[bytes], Any], AsyncIterator[bytes]]:
        forward = self.channel.stream_stream(method)

        async def stream(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            call = forward(requests, metadata=_metadata(context), timeout=context.time_remaining())
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as exc:
                await _abort(context, exc)

        return stream


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(
        (k, v) for k, v in (context.invocation_metadata() or ()) if not k.startswith(_RESERVED)
    )


async def _abort(context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError) -> None:
    trailing = exc.trailing_metadata()
    if trailing:
        context.set_trailing_metadata(tuple(trailing))
    details = exc.details() or ""
    if exc.code() is grpc.StatusCode.UNAVAILABLE and "connect" in details:
        details = ENGINE_GONE  # gRPC's own words name a socket file, not the situation
    await context.abort(exc.code(), details)
