"""The parent's end of a worker process's BLS pipe: the calls a model in the worker makes to
other models (child_bls.py is the child's end).

Child → parent: `("infer", id, BlsCall)`, `("stream", id, BlsCall)` (a decoupled call),
`("more", id)` (the model took one of a stream's responses), `("close", id)` (the model
stopped reading a stream); parent → child: `("result", id, BlsResult)`, once per call, or
once per response of a stream (the last one `final`). Calls are answered as they finish, in
any order, so a model's gathered `async_exec`s run at once. A stream sends at most
`STREAM_AHEAD` responses the model has not taken: then it waits (and the called model's own
bounded stream holds its sender), so no queue on either side grows without bound.

Each call runs through the instance's host (python_host.InstanceHost: the server's event
loop) for the requests the instance is executing (`callers`, set by the executing thread):
their deadline and trace carry over, and the call ends if their clients leave. The answers
are sent by a thread of this end's own: a pipe write can block, the server's loop must not.
"""

from __future__ import annotations

import concurrent.futures
import logging
import pickle
import queue
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from inferd.backends.python.bls_request import STREAM_AHEAD, BlsCall, BlsResult, Caller, executing
from inferd.backends.python.pb_utils.host import InstanceModelHost
from inferd.backends.python.pb_utils.triton_errors import TritonModelException

log = logging.getLogger("inferd.backends.python")


class BlsServer:
    def __init__(self, conn: Connection, host: InstanceModelHost | None, name: str) -> None:
        self._conn = conn
        self._host = host
        self.callers: tuple[Caller, ...] = ()  # of the batch the worker executes now
        self._streams: dict[int, _Relayed] = {}
        self._lock = threading.Lock()
        # Answers wait here for the sending thread: one per call in flight, up to
        # STREAM_AHEAD per stream.
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._name = name
        for target, role in ((self._serve, "bls"), (self._send_answers, "bls-send")):
            threading.Thread(target=target, name=f"{name}-{role}", daemon=True).start()

    def _finish(self) -> None:
        """Once the child's end closed: the sending thread stops and closes the pipe."""
        self._outbox.put(None)

    def _serve(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):  # the worker is gone (or stopped)
                break
            except Exception:  # a message that did not unpickle
                log.exception("model %s: an unreadable BLS message", self._name)
                continue
            kind, call_id = message[0], message[1]
            if kind in ("more", "close"):
                with self._lock:
                    relayed = self._streams.get(call_id)
                if relayed is not None:
                    relayed.taken() if kind == "more" else relayed.close()
                continue
            self._start(kind, call_id, message[2])
        self._finish()
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for relayed in streams:
            relayed.close()

    def _start(self, kind: str, call_id: int, call: BlsCall) -> None:
        host = self._host
        if host is None:
            self._answer(call_id, _error("BLS needs the inferd server the model runs in"))
            return
        try:
            with executing(self.callers):
                if kind == "stream":
                    stream = host.infer_stream(call)
                else:
                    future = host.infer(call)
        except TritonModelException as exc:
            self._answer(call_id, _error(exc.message()))
            return
        if kind == "stream":
            relayed = _Relayed(stream)
            with self._lock:
                self._streams[call_id] = relayed
            threading.Thread(
                target=self._relay,
                args=(call_id, relayed),
                name=f"{self._name}-bls-stream",
                daemon=True,
            ).start()
        else:
            future.add_done_callback(lambda f: self._answer(call_id, _outcome(f)))

    def _relay(self, call_id: int, relayed: _Relayed) -> None:
        """A decoupled call's responses, one by one, as the server's loop gives them and
        the model takes them."""
        try:
            for item in relayed.stream:
                self._answer(call_id, item)
                if item.final or not relayed.wait_credit():
                    break
        except Exception as exc:
            self._answer(call_id, _error(f"the call's stream failed: {exc}"))
        finally:
            with self._lock:
                self._streams.pop(call_id, None)

    def _answer(self, call_id: int, result: BlsResult) -> None:
        self._outbox.put(("result", call_id, result))  # never blocks: safe on the loop

    def _send_answers(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:  # the worker is gone: nothing reads or writes the pipe now
                self._conn.close()
                return
            try:
                data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
                self._conn.send_bytes(data)
            except (OSError, ValueError):  # the worker is gone: its calls with it
                return
            except Exception as exc:  # outputs that do not pickle: the call fails alone
                log.warning("model %s: a BLS answer could not be sent: %s", self._name, exc)
                fallback = ("result", message[1], _error(f"the answer could not be sent: {exc}"))
                try:
                    self._conn.send_bytes(pickle.dumps(fallback))
                except (OSError, ValueError):
                    return


class _Relayed:
    """A stream being relayed: how many more responses may go before the model takes one."""

    def __init__(self, stream: Iterator[BlsResult]) -> None:
        self.stream = stream
        self._credit = threading.Semaphore(STREAM_AHEAD)
        self._closed = False

    def wait_credit(self) -> bool:
        """Wait until the model may be sent another response; False once it stopped reading."""
        self._credit.acquire()
        return not self._closed

    def taken(self) -> None:
        self._credit.release()

    def close(self) -> None:
        self._closed = True
        self._credit.release()  # a relay waiting for credit wakes, and stops
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()


def _outcome(future: concurrent.futures.Future[BlsResult]) -> BlsResult:
    if future.cancelled():  # the server is stopping
        return BlsResult(None, "UNAVAILABLE", "the server is shutting down")
    exc = future.exception()
    return _error(f"the call failed: {exc}") if exc is not None else future.result()


def _error(message: str) -> BlsResult:
    return BlsResult(None, "INTERNAL", message)
