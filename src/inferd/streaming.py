"""Streaming inference: `DataPlane.stream_infer`, and one request to a decoupled model.

`stream_infer` (the DataPlane's, defined here in `StreamingEntry`) answers a model that is
not decoupled through `infer`, once. For a decoupled model it admits and decodes the request
as `infer` does, then hands it to a `DecoupledCall`:

- the request is submitted to the batcher in a task of its own; the instance executing it
  gives the model a sender that writes to the request's `ResponseStream`;
- `responses()` yields each response as the model sends it, its outputs checked against the
  config (the outputs it holds: a decoupled response may carry a subset of them);
- a client that goes away cancels the stream (the model reads `is_cancelled()` as true), and
  a request still waiting in the queue leaves it unexecuted;
- the request's record (statistics, metrics, logs) is told once, when the model has closed the
  stream and the execution has returned, with each response's timing and the dropped count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol

from inferd import classification
from inferd.circuit import CircuitBreaker
from inferd.conformance import OutputMismatchError, conform_output
from inferd.errors import ErrorKind, InferdError, invalid, unavailable
from inferd.events import (
    CANCELLED,
    FAILURE_REASON,
    CallContext,
    ExecutionTimes,
    RequestRecord,
    ResponseTimes,
    Telemetry,
    note_failure,
)
from inferd.infer_call import InferCall
from inferd.repository.model_state import ModelVersion
from inferd.repository.registry import ModelRegistry
from inferd.scheduling.admission import scheduling_parameters
from inferd.scheduling.sequence_parameters import sequence_parameters
from inferd.signature import BoundRequest
from inferd.streams import ResponseStream, StreamItem, StreamResponse
from inferd.types import Array, InferRequest, InferResponse, Tensor

# Failures that say something about the model (they count for its circuit breaker).
MODEL_FAILURES = {ErrorKind.MODEL_ERROR, ErrorKind.INTERNAL, ErrorKind.DEADLINE_EXCEEDED}


def unary_to_decoupled(model: str, ctx: CallContext) -> InferdError:
    """Triton's answer to a one-response call to a decoupled model, with where to go."""
    if ctx.protocol == "grpc":
        message = (
            "ModelInfer RPC doesn't support models with decoupled transaction policy; "
            f"model '{model}' answers over ModelStreamInfer"
        )
    else:
        message = (
            "HTTP end point doesn't support models with decoupled transaction policy; "
            f"model '{model}' answers over POST /v2/models/{model}/generate_stream"
        )
    return InferdError(ErrorKind.UNSUPPORTED, message)


class _Core(Protocol):
    """What `stream_infer` uses of the DataPlane."""

    registry: ModelRegistry
    telemetry: Telemetry
    _inflight: int

    def start(self, model_name: str, version: str, ctx: CallContext) -> InferCall: ...

    def admit(self, call: InferCall) -> None: ...

    async def infer(self, call: InferCall, request: InferRequest) -> InferResponse: ...

    def respond(self, call: InferCall, response: InferResponse) -> InferResponse: ...

    def stream_infer(
        self,
        model_name: str,
        version: str,
        decode: Callable[[], Awaitable[InferRequest]],
        ctx: CallContext,
        fallback_from: str = "",
    ) -> AsyncGenerator[StreamResponse, None]: ...

    def _admit(
        self, model_name: str, version: str, ctx: CallContext, record: RequestRecord
    ) -> ModelVersion: ...

    def _request_over(self) -> None: ...


class StreamingEntry:
    """The DataPlane's streaming entry, beside `infer` (a mixin: it only holds the method)."""

    async def stream_infer(
        self: _Core,
        model_name: str,
        version: str,
        decode: Callable[[], Awaitable[InferRequest]],
        ctx: CallContext,
        fallback_from: str = "",
    ) -> AsyncGenerator[StreamResponse, None]:
        """The responses to one request as they come: a decoupled model's any number, then
        an item with `final` set (a response, an error or the final flag alone); a model that
        is not decoupled answers once, as `infer`. A failure before the first response
        raises, as in `infer`; later ones arrive as items holding the error."""
        try:
            decoupled = self.registry.get(model_name, version, ctx.routing_key).decoupled
        except InferdError:
            decoupled = False  # `infer` answers (and counts) the lookup's error
        if not decoupled:
            with self.start(model_name, version, ctx) as unary:  # as the unary APIs
                self.admit(unary)
                request = await decode()
                response = self.respond(unary, await self.infer(unary, request))
            if fallback_from:
                response.parameters["fallback_from"] = fallback_from
            yield StreamResponse(response, None, True)
            return
        record = RequestRecord(model="", version="", ctx=ctx, duration_ns=0)
        self._inflight += 1
        try:
            self._admit(model_name, version, ctx, record)
            request = await decode()
            record.request = request
            record.request_id = request.id
            circuit = self.registry.models[model_name].circuit
            if not circuit.allow():
                fallback = circuit.policy.fallback_model
                if not fallback:
                    raise unavailable(
                        f"model '{model_name}' is failing: its circuit is open, retry in "
                        f"{circuit.retry_in_s():.0f} s"
                    )
            else:
                fallback = ""
                mv = self.registry.get(model_name, version, ctx.routing_key or request.id)
                record.model, record.version = mv.name, mv.version
                if not mv.decoupled:  # a canary version routed by request id may not be
                    raise unavailable(
                        f"model '{model_name}' version {mv.version} is not decoupled, but the "
                        "version this stream was opened for is: serve versions of one "
                        "transaction policy side by side"
                    )
                if request.uses_shared_memory:
                    raise invalid(
                        f"model '{mv.name}' is decoupled: its responses cannot be written to "
                        "shared memory regions; send its inputs and take its outputs in the "
                        "request and responses"
                    )
                bound = mv.signature.bind(request)
                bound.classes = classification.requested_classes(request, mv.signature)
                record.rows = bound.rows
                priority, timeout_us = scheduling_parameters(request)
                if request.parameters or mv.sequence is not None:
                    bound.correlation_id, bound.flags = sequence_parameters(
                        request, mv.name, mv.sequence is not None
                    )
                call = DecoupledCall(
                    mv, bound, record, (priority, timeout_us, ctx.deadline_ns), fallback_from
                )
                call.on_done(self.telemetry, circuit, self._request_over)
        except BaseException as exc:
            self._request_over()
            note_failure(record, exc)
            record.duration_ns = time.perf_counter_ns() - ctx.start_ns
            self.telemetry.request(record)
            raise
        if fallback:
            # Served and counted as the fallback model's request, as `infer` does.
            self._request_over()

            async def decoded() -> InferRequest:
                return request

            stream = self.stream_infer(fallback, "", decoded, ctx, fallback_from=model_name)
        else:
            stream = call.responses()
        async with contextlib.aclosing(stream) as items:
            async for item in items:
                yield item


class DecoupledCall:
    """One admitted, bound request to a decoupled model version, until its record is told."""

    def __init__(
        self,
        mv: ModelVersion,
        bound: BoundRequest,
        record: RequestRecord,
        scheduling: tuple[int, int, int | None],  # priority, timeout (µs), deadline (ns)
        fallback_from: str = "",
    ) -> None:
        loop = asyncio.get_running_loop()
        self._mv = mv
        self._bound = bound
        self._record = record
        self._fallback_from = fallback_from
        self._telemetry = Telemetry()
        self._circuit: CircuitBreaker | None = None
        self._over: Callable[[], None] = _nothing
        self.stream = ResponseStream(loop)
        bound.responses = self.stream
        self._items: list[ResponseTimes] = []
        self._previous_ns = 0  # when the previous response was sent
        self._output_ns = 0
        self._error: InferdError | None = None  # the final item's error, if it had one
        self._finished = False  # the client received the final item
        self._end_ns = 0
        assert mv.batcher is not None  # a READY version always has one
        self._submit = loop.create_task(mv.batcher.submit(bound, *scheduling))
        # Done when the execution has returned, the model has closed the stream and the client
        # has had its last item (or has gone).
        self._pending = 3
        self._submit.add_done_callback(self._executed)
        self.stream.closed.add_done_callback(lambda _: self._one_done())

    def on_done(
        self, telemetry: Telemetry, circuit: CircuitBreaker, over: Callable[[], None]
    ) -> None:
        """Where its outcome goes once the request is over; `over` runs first."""
        self._telemetry, self._circuit, self._over = telemetry, circuit, over

    async def responses(self) -> AsyncGenerator[StreamResponse, None]:
        """Each item of the stream as it comes; the last one has `final` set. A stream that
        ends with an error before any response (the request never executed, or its model
        failed at once) raises it instead: the request's error, as `infer` would raise."""
        try:
            while True:
                item = await self.stream.next()
                response = self._convert(item)
                if item.final:
                    self._finished = True
                    self._error = response.error
                    if response.error is not None and len(self._items) == 1:
                        raise response.error
                yield response
                if item.final:
                    return
        finally:
            self._end_ns = time.perf_counter_ns()
            if not self._finished and self.stream.started_ns == 0:
                self._submit.cancel()  # still queued: it leaves the queue unexecuted
            self.stream.cancel()  # drops what nobody will read; unblocks a waiting sender
            self._one_done()

    def _convert(self, item: StreamItem) -> StreamResponse:
        started = self._previous_ns or self.stream.started_ns or item.sent_ns
        infer_ns = max(0, item.sent_ns - started)
        self._previous_ns = item.sent_ns
        mv = self._mv
        if item.error is not None:
            self._items.append(ResponseTimes("fail", infer_ns, 0))
            return StreamResponse(None, item.error, item.final)
        if item.outputs is None:
            self._items.append(ResponseTimes("empty", infer_ns, 0))
            return StreamResponse(None, None, item.final)
        t0 = time.perf_counter_ns()
        signature = mv.signature
        try:
            tensors: list[Tensor] = [
                conform_output(signature, signature.outputs[name], item.outputs, self._bound.rows)
                for name in self._bound.output_names
                if name in item.outputs
            ]
            if self._bound.classes:
                tensors = classification.apply(tensors, self._bound.classes, signature)
        except OutputMismatchError as exc:
            error = InferdError(
                ErrorKind.MODEL_ERROR, f"model '{mv.name}' version {mv.version}: {exc.message}"
            )
            self._items.append(ResponseTimes("fail", infer_ns, 0))
            return StreamResponse(None, error, item.final)
        output_ns = time.perf_counter_ns() - t0
        self._output_ns += output_ns
        self._items.append(ResponseTimes("success", infer_ns, output_ns))
        response = InferResponse(mv.name, mv.version, tensors, id=self._bound.request_id)
        if self._fallback_from:
            response.parameters["fallback_from"] = self._fallback_from
        return StreamResponse(response, None, item.final)

    def _executed(self, task: asyncio.Task[tuple[dict[str, Array], ExecutionTimes]]) -> None:
        if task.cancelled():
            self.stream.fail(InferdError(ErrorKind.UNAVAILABLE, "the client cancelled the request"))
        elif (exc := task.exception()) is not None:
            # Never executed (shed, deadline, unloading) or its execution failed: the stream
            # ends with that error, unless the model closed it already.
            error = (
                exc if isinstance(exc, InferdError) else InferdError(ErrorKind.INTERNAL, str(exc))
            )
            self.stream.fail(error)
        self._one_done()

    def _one_done(self) -> None:
        self._pending -= 1
        if self._pending:
            return
        record = self._record
        task = self._submit
        if not task.cancelled() and task.exception() is None:
            _, times = task.result()
            times.compute_output_ns += self._output_ns
            record.times = times
        cancelled = not self._finished
        if cancelled:
            self._items.append(ResponseTimes("cancel", 0, 0))
        record.responses = self._items
        record.dropped = self.stream.dropped
        record.duration_ns = self._end_ns - record.ctx.start_ns
        self._over()
        # Its outcome counts once, like `infer`'s.
        circuit, error = self._circuit, self._error
        if cancelled:
            record.failure = CANCELLED
            record.message = "the client cancelled the request"
        elif error is not None:
            record.failure = FAILURE_REASON[error.kind]
            record.message = error.message
        if circuit is not None:
            # As `infer`: a success counts, a failure only when it says something about the
            # model (not a bad request, not a client that left).
            failed_model = error is not None and error.kind in MODEL_FAILURES
            circuit.record(
                record.failure is None, counts=not cancelled and (error is None or failed_model)
            )
        self._telemetry.request(record)


def _nothing() -> None:
    pass
