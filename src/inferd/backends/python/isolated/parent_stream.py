"""Decoupled models in a worker process (`isolation: "process"`): streams across the pipe.

The parent's `StreamingProcessInstance` sends the child one request at a time, `("stream",
inputs, rows, output names, request id, parameters)`. The child runs `predict_stream` with a
`PipeSink`: each response the model sends is a `("response", outputs, error, final)` message,
and `("done", error | None)` follows when `predict_stream` returns. The parent relays each
response into the request's `ResponseStream` as it arrives:

- backpressure: while the request's stream is full the parent stops reading the pipe; once
  the pipe's buffer is full too, the model's send blocks in the child;
- cancellation: the parent raises the worker's shared flag when the stream is cancelled
  (checked at each message, and at least every 0.1 s while waiting); the child's
  `is_cancelled()` reads it;
- a worker streams one request until its final flag: a model that hands the sender to a thread
  of its own and returns keeps its worker until that thread closes the stream;
- a worker that dies mid-stream ends the stream with the crash's message and is restarted, as
  for a batch.

This module is the parent's side; the child's is child_stream.py.
"""

from __future__ import annotations

import contextlib

from inferd.backends.python.bls_request import current_callers
from inferd.backends.python.isolated.isolated_instance import ProcessInstance
from inferd.backends.python.isolated.pipe import ModelProcessDiedError
from inferd.backends.python.isolated.process_spec import from_wire
from inferd.errors import ErrorKind, InferdError
from inferd.streams import CollectingSink, StreamClosedError
from inferd.tensors.signature import BoundRequest
from inferd.types import Array

_CANCEL_POLL_S = 0.1  # how long the parent waits for a message before it checks for a cancel


class StreamingProcessInstance(ProcessInstance):
    """A decoupled `Model` in its own worker process; a `RequestListInstance`."""

    def execute_requests(
        self, requests: list[BoundRequest]
    ) -> list[dict[str, Array] | InferdError]:
        return [self._stream(request) for request in requests]

    def _stream(self, request: BoundRequest) -> dict[str, Array] | InferdError:
        sink = request.responses if request.responses is not None else CollectingSink()
        worker = self._ready_process()
        worker.bls.callers = current_callers()
        worker.cancelled[0] = 0
        sink.started()
        message = (
            "stream",
            request.inputs,
            request.rows,
            request.output_names,
            request.request_id,
            dict(request.parameters),
        )
        done, final = False, False
        error: InferdError | None = None
        try:
            worker.send(message)
            while not (done and final):
                if sink.is_cancelled():
                    worker.cancelled[0] = 1
                try:
                    reply = worker.receive(timeout=_CANCEL_POLL_S)
                except TimeoutError:
                    continue
                if reply[0] == "response":
                    _, outputs, wire_error, is_final = reply
                    final = final or is_final
                    # A send after the final flag was refused in the child, in the model.
                    with contextlib.suppress(StreamClosedError):
                        sink.send(outputs, from_wire(wire_error), is_final)
                elif reply[0] == "done":
                    done = True
                    error = from_wire(reply[1])
        except ModelProcessDiedError as exc:
            self._begin_restart(worker)
            died = InferdError(
                ErrorKind.MODEL_ERROR,
                f"model '{self._name}': the model's worker process died ({exc}) while "
                "streaming this request; it is being restarted",
            )
            sink.fail(died)
            return died
        return {} if error is None else error
