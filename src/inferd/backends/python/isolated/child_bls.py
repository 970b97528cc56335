"""The child's end of the BLS pipe (parent_bls.py has the protocol): a model's calls to
other models, from any thread of the worker, each with an id; a reader thread hands each
answer to the call that waits for it (a stream's: into its queue, which holds at most
STREAM_AHEAD responses the model has not taken: it says when it took one)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import pickle
import queue
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from inferd.backends.python.bls_request import BlsCall, BlsResult

_GONE = BlsResult(None, "UNAVAILABLE", "the server closed the model's BLS pipe")


class BlsClient:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one send at a time; guards _waiting
        self._waiting: dict[int, concurrent.futures.Future[BlsResult] | queue.SimpleQueue[Any]] = {}
        self._gone = False
        threading.Thread(target=self._read, name="inferd-bls-reader", daemon=True).start()

    def infer(self, call: BlsCall) -> concurrent.futures.Future[BlsResult]:
        future: concurrent.futures.Future[BlsResult] = concurrent.futures.Future()
        self._send("infer", call, future)
        return future

    def infer_stream(self, call: BlsCall) -> Iterator[BlsResult]:
        answers: queue.SimpleQueue[BlsResult] = queue.SimpleQueue()
        call_id = self._send("stream", call, answers)
        return _PipeStream(self, call_id, answers)

    def _send(
        self,
        kind: str,
        call: BlsCall,
        waiter: concurrent.futures.Future[BlsResult] | queue.SimpleQueue[Any],
    ) -> int:
        data = None
        with self._lock:
            call_id = next(self._ids)
            if self._gone:
                _deliver(waiter, _GONE)
                return call_id
            self._waiting[call_id] = waiter
            data = pickle.dumps((kind, call_id, call), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError):
                self._waiting.pop(call_id, None)
                _deliver(waiter, _GONE)
        return call_id

    def took(self, call_id: int) -> None:
        """The model took one of a stream's responses: the parent may send one more."""
        with self._lock:
            if self._gone or call_id not in self._waiting:
                return
            with contextlib.suppress(OSError, ValueError):
                self._conn.send_bytes(pickle.dumps(("more", call_id)))

    def close_stream(self, call_id: int) -> None:
        with self._lock:
            if self._waiting.pop(call_id, None) is None or self._gone:
                return
            with contextlib.suppress(OSError, ValueError):
                self._conn.send_bytes(pickle.dumps(("close", call_id)))

    def _read(self) -> None:
        while True:
            try:
                _, call_id, result = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                waiter = self._waiting.get(call_id)
                if waiter is not None and (
                    result.final or isinstance(waiter, concurrent.futures.Future)
                ):
                    del self._waiting[call_id]
            if waiter is not None:
                _deliver(waiter, result)
        with self._lock:
            self._gone = True
            waiting, self._waiting = list(self._waiting.values()), {}
        for waiter in waiting:
            _deliver(waiter, _GONE)


def _deliver(
    waiter: concurrent.futures.Future[BlsResult] | queue.SimpleQueue[Any], result: BlsResult
) -> None:
    if isinstance(waiter, concurrent.futures.Future):
        if not waiter.done():
            waiter.set_result(result)
    else:
        waiter.put(result)


class _PipeStream:
    def __init__(
        self, client: BlsClient, call_id: int, answers: queue.SimpleQueue[BlsResult]
    ) -> None:
        self._client = client
        self._id = call_id
        self._answers = answers
        self._done = False

    def __iter__(self) -> _PipeStream:
        return self

    def __next__(self) -> BlsResult:
        if self._done:
            raise StopIteration
        item = self._answers.get()
        self._done = item.final
        if not item.final:
            self._client.took(self._id)
        return item

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._client.close_stream(self._id)

    def __del__(self) -> None:  # the model dropped the iterator before its end
        self.close()
