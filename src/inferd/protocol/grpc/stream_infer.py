"""Triton's `ModelStreamInfer` over the DataPlane's streaming steps: the servicer's streaming
method (a part of `InferenceServicer`, protocol/grpc/service.py), and the call context of a
gRPC call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from inferd.dataplane.plane import DataPlane
from inferd.errors import InferdError, invalid
from inferd.events import CallContext
from inferd.limits import Limits
from inferd.protocol.grpc.error_status import INTERNAL_DETAILS, grpc_error
from inferd.protocol.grpc.protobuf_codec import (
    decode_infer_request,
    parse_infer_request,
    serialize_infer_response,
)
from inferd.protocol.offload import Offload
from inferd.streams import STREAM_QUEUE_LIMIT, StreamResponse
from inferd.types import InferRequest, min_wire_bytes

log = logging.getLogger("inferd.grpc")


class StreamInferMethod:
    """`ModelStreamInfer`, over the DataPlane's streaming steps."""

    def __init__(
        self, dataplane: DataPlane, limits: Limits, offload: Offload, max_response_bytes: int = 0
    ) -> None:
        self.dp = dataplane
        self.limits = limits
        self.offload = offload
        self.max_response_bytes = max_response_bytes
        self.streams_held = 0  # ModelStreamInfer streams not read for want of room

    async def ModelStreamInfer(
        self, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[bytes]:
        """Each request of the stream runs as soon as it arrives; its responses (a decoupled
        model's any number, or errors, which don't end the stream) come back as they are
        ready, each carrying the request's id and, as Triton's, `triton_final_response`.

        Bounded twice, so that a client that never reads costs the server a fixed amount:
        at most `max_stream_pending` requests are in progress (read, with responses still to
        come); past that the stream is not read, and gRPC's flow control stops the client's
        sends. And at most STREAM_QUEUE_LIMIT messages wait to be written, which holds back
        the requests' responses, down to the models' senders."""
        done: asyncio.Queue[bytes | None] = asyncio.Queue(STREAM_QUEUE_LIMIT)
        tasks: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(self.limits.max_stream_pending)

        async def one(raw: bytes) -> None:
            request: Any = None  # the parsed message, once it parses
            try:
                request = await self.offload.run(len(raw), parse_infer_request, raw)
                ctx = call_context(context)
                with self.dp.start_stream(request.model_name, request.model_version, ctx) as call:
                    self.dp.admit_stream(call)
                    decoded = await self.offload.run(
                        len(raw), decode_infer_request, request, self.limits.max_bytes_elements
                    )
                    empty_final = _empty_final_wanted(decoded)
                    items = await self.dp.stream(call, decoded)
                async with contextlib.aclosing(items):
                    async for item in items:
                        message = await self._stream_message(request, item, empty_final)
                        if message is not None:
                            await done.put(message)
            except InferdError as exc:
                await done.put(_stream_error(request, grpc_error(exc).details))
            except Exception:
                log.exception("unhandled error in ModelStreamInfer")
                await done.put(_stream_error(request, INTERNAL_DETAILS))
            finally:
                room.release()

        async def read() -> None:
            incoming = aiter(requests)
            while True:
                if room.locked():  # max_stream_pending in progress: wait for the client
                    self.streams_held += 1
                    try:
                        await room.acquire()
                    finally:
                        self.streams_held -= 1
                else:
                    await room.acquire()
                try:
                    raw = await anext(incoming)
                except StopAsyncIteration:
                    break
                task = asyncio.create_task(one(raw))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
            await done.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await done.get()) is not None:
                yield item  # resumed once gRPC has sent it (or queued it within its window)
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _stream_message(
        self, request: Any, item: StreamResponse, empty_final: bool
    ) -> bytes | None:
        """One stream message's wire bytes (a large response serialised off the loop)."""
        if item.response is not None:
            response = item.response
            return await self.offload.run(
                min_wire_bytes(response.outputs),
                serialize_infer_response,
                response,
                self.max_response_bytes,
                {FINAL: item.final},
            )
        if item.error is not None:
            return _stream_error(request, grpc_error(item.error).details, item.final)
        if empty_final:  # the final flag alone
            return _stream_error(request, "", True)
        return None


def call_context(context: Any) -> CallContext:
    metadata = dict(context.invocation_metadata() or ())
    start_ns = time.perf_counter_ns()
    remaining_s = context.time_remaining()  # the client's gRPC deadline, if it set one
    return CallContext(
        "grpc",
        context.peer() or "",
        metadata.get("traceparent", ""),
        time.time(),
        start_ns,
        metadata.get("inferd-routing-key", ""),
        None if remaining_s is None else start_ns + int(remaining_s * 1e9),
    )


EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"


def _empty_final_wanted(request: InferRequest) -> bool:
    """Triton's stream parameter: send the final flag as an empty response when it comes
    without one. Taken out of the request's parameters: it is for the server, not the model."""
    wanted = request.parameters.pop(EMPTY_FINAL, False)
    if not isinstance(wanted, bool):
        raise invalid(f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param")
    return wanted


def _stream_error(request: Any, message: str, final: bool = True) -> bytes:
    """An error on the stream, naming the request (when it could be parsed at all)."""
    answer = pb.ModelStreamInferResponse(error_message=message)
    if request is not None:
        answer.infer_response.model_name = request.model_name
        answer.infer_response.model_version = request.model_version
        answer.infer_response.id = request.id
    answer.infer_response.parameters[FINAL].bool_param = final
    return bytes(answer.SerializeToString())
