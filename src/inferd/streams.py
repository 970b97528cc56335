"""Response streams: the responses of one decoupled request, from the model to the client.

A decoupled model (`model_transaction_policy { decoupled: true }`) answers a request with zero
or more responses and then the final flag, sent from the model's thread (inside `execute`, or
later from a thread of its own). A `ResponseStream` carries them to the event loop, in order:

- Bounded: at most `STREAM_QUEUE_LIMIT` responses wait for the client. A model sending faster
  than its client reads blocks in `send` until the client takes one, so backpressure reaches
  the model and a slow client never makes the server buffer without bound.
- Cancellable: when the client goes away, `cancel()` wakes a blocked sender, `is_cancelled()`
  turns true, and what the model sends afterwards is dropped and counted (`dropped`). The
  model is not failed; as in Triton it still ends with the final flag.
- Closed once: the final flag closes it, and a send after that raises `StreamClosedError`.
  The server may end it first (`fail`: the execution raised, the deadline passed, the model
  let go of its sender without the final flag, or the request left the queue unexecuted);
  the model then reads `is_cancelled()` as true and its sends are dropped, never raised.

The lock is only held for a few list operations, never across an await; the consumer waits
on a future the producer resolves through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from inferd.errors import ErrorKind, InferdError
from inferd.types import Array, InferResponse

# Responses one request may have waiting for its client before the model's send blocks.
STREAM_QUEUE_LIMIT = 16


class StreamClosedError(Exception):
    """A send after the stream was closed (the final flag was sent already)."""


@dataclass(slots=True)
class StreamItem:
    """One thing the model sent: a response (outputs or an error), the final flag, or both."""

    outputs: dict[str, Array] | None  # None: no response (the final flag alone, or an error)
    error: InferdError | None
    final: bool
    sent_ns: int  # perf_counter_ns when the model sent it

    @property
    def is_response(self) -> bool:
        return self.outputs is not None or self.error is not None


class ResponseSink(Protocol):
    """Where a decoupled model's responses for one request go (the producer's side)."""

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: InferdError | None = None,
        final: bool = False,
    ) -> None:
        """Send a response and/or the final flag; may block while the client catches up.
        Raises `StreamClosedError` after the final flag."""
        ...

    def fail(self, error: InferdError) -> bool:
        """End the stream with `error` unless it is closed already (then False); never
        blocks."""
        ...

    def is_cancelled(self) -> bool: ...

    def started(self) -> None:
        """The request's execution begins (for its statistics)."""
        ...


class ResponseStream:
    """One request's responses; produced from any thread, consumed on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = STREAM_QUEUE_LIMIT) -> None:
        self._loop = loop
        self._limit = limit
        self._items: deque[StreamItem] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._failed = False  # closed by `fail`: a sender still blocked drops its response
        self._cancelled = False
        self._waiter: asyncio.Future[None] | None = None
        self.senders_waiting = 0  # senders blocked on the limit (backpressure), for tests
        self.dropped = 0  # responses sent after the client left (or left unread by it)
        self.started_ns = 0  # when its execution began; 0 until then
        # Resolved on the loop once the producer's side is closed: nothing more will come.
        self.closed: asyncio.Future[None] = loop.create_future()

    # -- the producer's side (the model's threads) ---------------------------------------

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: InferdError | None = None,
        final: bool = False,
    ) -> None:
        item = StreamItem(outputs, error, final, time.perf_counter_ns())
        with self._cond:
            if self._closed and not self._failed:
                raise StreamClosedError("the response stream is closed: the final flag was sent")
            if final:
                self._closed = True
            while len(self._items) >= self._limit and not (self._cancelled or self._failed):
                self.senders_waiting += 1
                self._cond.wait()
                self.senders_waiting -= 1
            if self._cancelled or self._failed:
                if item.is_response:
                    self.dropped += 1
            else:
                self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None or final:
            self._notify(waiter, final)

    def fail(self, error: InferdError) -> bool:
        with self._cond:
            if self._closed:
                return False
            self._closed = self._failed = True
            self._cond.notify_all()  # a sender blocked on the limit drops its response
            if not self._cancelled:
                # The terminal item may pass the limit: it never blocks its sender.
                self._items.append(StreamItem(None, error, True, time.perf_counter_ns()))
            waiter, self._waiter = self._waiter, None
        self._notify(waiter, True)
        return True

    def is_cancelled(self) -> bool:
        return self._cancelled or self._failed

    def started(self) -> None:
        self.started_ns = time.perf_counter_ns()

    def _notify(self, waiter: asyncio.Future[None] | None, closed: bool) -> None:
        # The loop may be gone (the server stopped while a model thread still sends).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake, waiter, closed)

    def _wake(self, waiter: asyncio.Future[None] | None, closed: bool) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if closed and not self.closed.done():
            self.closed.set_result(None)

    # -- the consumer's side (the event loop) --------------------------------------------

    async def next(self) -> StreamItem:
        """The next item, waiting for the model to send it."""
        while True:
            with self._cond:
                if self._items:
                    item = self._items.popleft()
                    self._cond.notify()  # a sender blocked on the limit may go on
                    return item
                waiter = self._loop.create_future()
                self._waiter = waiter
            await waiter

    def cancel(self) -> None:
        """The client went away: unblock the sender, drop what waits and what comes."""
        with self._cond:
            if self._cancelled:
                return
            self._cancelled = True
            self.dropped += sum(1 for item in self._items if item.is_response)
            self._items.clear()
            self._cond.notify_all()


@dataclass(slots=True)
class StreamResponse:
    """What the core hands an adapter for each item of a request's stream."""

    response: InferResponse | None  # None: the final flag alone, or an error
    error: InferdError | None
    final: bool


class CollectingSink:
    """A sink that keeps the first responses, for warm-up samples of decoupled models."""

    def __init__(self, keep: int = STREAM_QUEUE_LIMIT) -> None:
        self.items: list[StreamItem] = []
        self._keep = keep
        self._closed = False

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: InferdError | None = None,
        final: bool = False,
    ) -> None:
        if self._closed:
            raise StreamClosedError("the response stream is closed: the final flag was sent")
        self._closed = final
        if len(self.items) < self._keep:
            self.items.append(StreamItem(outputs, error, final, time.perf_counter_ns()))

    def fail(self, error: InferdError) -> bool:
        if self._closed:
            return False
        self._closed = True
        self.items.append(StreamItem(None, error, True, time.perf_counter_ns()))
        return True

    def is_cancelled(self) -> bool:
        return False

    def started(self) -> None:
        pass


def guard_release(sender: object, sink: ResponseSink, model: str) -> None:
    """End `sink` with an error once `sender` is garbage: a model that lets go of its
    sender without the final flag would otherwise leave its client waiting forever. (A
    no-op when the stream closed first, which is the normal case.)"""
    error = InferdError(
        ErrorKind.MODEL_ERROR,
        f"model '{model}' released the request's response sender without sending the final flag",
    )
    weakref.finalize(sender, sink.fail, error)
