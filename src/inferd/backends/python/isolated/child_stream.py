"""The child's side of a decoupled model's stream across the worker pipe (the protocol, and
the parent's side: parent_stream.py): each response the model sends becomes a
`("response", ...)` message, and `("done", error | None)` ends the exchange."""

from __future__ import annotations

import pickle
import threading
from multiprocessing.connection import Connection
from typing import Any

from inferd.backends.python.isolated.process_spec import to_wire
from inferd.errors import InferdError
from inferd.streams import StreamClosedError
from inferd.tensors.signature import BoundRequest
from inferd.types import Array


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
        message = ("response", outputs, to_wire(error), final)
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
    pipe.send_bytes(pickle.dumps(("done", to_wire(error))))
