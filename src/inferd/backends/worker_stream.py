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
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from multiprocessing.connection import Connection
from typing import Any

from inferd.backends.worker_pipe import WorkerDiedError
from inferd.backends.worker_process import ProcessInstance
from inferd.errors import ErrorKind, InferdError
from inferd.signature import BoundRequest
from inferd.streams import CollectingSink, StreamClosedError
from inferd.types import Array

_CANCEL_POLL_S = 0.1  # how long the parent waits for a message before it checks for a cancel

Wire = tuple[str, str] | None  # an InferdError across the pipe: (kind, message)


def _to_wire(error: InferdError | None) -> Wire:
    return None if error is None else (error.kind.value, error.message)


def _from_wire(error: Wire) -> InferdError | None:
    return None if error is None else InferdError(ErrorKind(error[0]), error[1])


# -- the parent -------------------------------------------------------------------------------


class StreamingProcessInstance(ProcessInstance):
    """A decoupled `Model` in its own worker process; a `RequestListInstance`."""

    def execute_requests(
        self, requests: list[BoundRequest]
    ) -> list[dict[str, Array] | InferdError]:
        return [self._stream(request) for request in requests]

    def _stream(self, request: BoundRequest) -> dict[str, Array] | InferdError:
        sink = request.responses if request.responses is not None else CollectingSink()
        worker = self._ready_worker()
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
                        sink.send(outputs, _from_wire(wire_error), is_final)
                elif reply[0] == "done":
                    done = True
                    error = _from_wire(reply[1])
        except WorkerDiedError as exc:
            self._begin_restart(worker)
            died = InferdError(
                ErrorKind.MODEL_ERROR,
                f"model '{self._name}': the model's worker process died ({exc}) while "
                "streaming this request; it is being restarted",
            )
            sink.fail(died)
            return died
        return {} if error is None else error


# -- the child --------------------------------------------------------------------------------


class PipeSender:
    """The child's end of the main pipe, shared by its main loop and the model's threads."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send_bytes(self, data: bytes) -> None:
        with self._lock:  # blocks while the pipe is full: backpressure reaches the model
            self._conn.send_bytes(data)


class PipeSink:
    """A `ResponseSink` in the child: each send is a message to the parent."""

    def __init__(self, pipe: PipeSender, cancelled: Any) -> None:
        self._pipe = pipe
        self._cancelled = cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: InferdError | None = None,
        final: bool = False,
    ) -> None:
        with self._lock:
            if self._closed:
                raise StreamClosedError("the response stream is closed: the final flag was sent")
            self._closed = final
        self._put(outputs, error, final)

    def fail(self, error: InferdError) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self._put(None, error, True)
        return True

    def is_cancelled(self) -> bool:
        return bool(self._cancelled[0])

    def started(self) -> None:
        pass

    def _put(
        self, outputs: dict[str, Array] | None, error: InferdError | None, final: bool
    ) -> None:
        message = ("response", outputs, _to_wire(error), final)
        self._pipe.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def serve_stream(instance: Any, message: tuple[Any, ...], pipe: PipeSender, cancelled: Any) -> None:
    """Run one `("stream", ...)` request through the model (`StreamingPythonInstance`)."""
    _, inputs, rows, output_names, request_id, parameters = message
    sink = PipeSink(pipe, cancelled)
    request = BoundRequest(
        inputs, rows, (), output_names, request_id, parameters=parameters, responses=sink
    )
    (result,) = instance.execute_requests([request])
    error = result if isinstance(result, InferdError) else None
    pipe.send_bytes(pickle.dumps(("done", _to_wire(error))))
