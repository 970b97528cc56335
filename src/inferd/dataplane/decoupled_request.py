"""One admitted, bound request to a decoupled model version (decoupled.py starts it):

- the request is submitted to the batcher in a task of its own; the instance executing it
  gives the model a sender that writes to the request's `ResponseStream`;
- `responses()` yields each response as the model sends it, its outputs checked against the
  config (the outputs it holds: a decoupled response may carry a subset of them);
- a client that goes away cancels the stream (the model reads `is_cancelled()` as true), and
  a request still waiting in the queue leaves it unexecuted;
- the request's record (statistics, metrics, logs), handed over by its `StreamCall`, is told
  once, when the model has closed the stream and the execution has returned, with each
  response's timing and the dropped count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from inferd.dataplane.unary_request import StreamCall
from inferd.errors import ErrorKind, InferdError
from inferd.events import CANCELLED, FAILURE_REASON, ExecutionTimes, ResponseTimes
from inferd.reliability.circuit import CircuitBreaker
from inferd.repository.model_state import ModelVersion
from inferd.streams import ResponseStream, StreamItem, StreamResponse
from inferd.tensors import classification
from inferd.tensors.conformance import OutputMismatchError, conform_output
from inferd.tensors.signature import BoundRequest
from inferd.types import Array, InferResponse, Tensor

# Failures that say something about the model (they count for its circuit breaker).
MODEL_FAILURES = {ErrorKind.MODEL_ERROR, ErrorKind.INTERNAL, ErrorKind.DEADLINE_EXCEEDED}


class DecoupledCall:
    """One admitted, bound request to a decoupled model version, until its record is told."""

    def __init__(
        self,
        call: StreamCall,
        mv: ModelVersion,
        bound: BoundRequest,
        scheduling: tuple[int, int, int | None],  # priority, timeout (µs), deadline (ns)
        circuit: CircuitBreaker,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._call = call
        self._mv = mv
        self._bound = bound
        self._record = call.record
        self._fallback_from = call.fallback_from
        self._circuit = circuit
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
        # Its outcome counts once, like `infer`'s.
        circuit, error = self._circuit, self._error
        if cancelled:
            record.failure = CANCELLED
            record.message = "the client cancelled the request"
        elif error is not None:
            record.failure = FAILURE_REASON[error.kind]
            record.message = error.message
        # As `infer`: a success counts, a failure only when it says something about the
        # model (not a bad request, not a client that left).
        failed_model = error is not None and error.kind in MODEL_FAILURES
        circuit.record(
            record.failure is None, counts=not cancelled and (error is None or failed_model)
        )
        self._call.told()
