"""The skeleton of inferd's background writers (capture files, trace files): a deque the event
loop appends to without waking anyone, a thread that drains it (polling, or woken), a flush
marker to wait on, and a close that hands the thread a last `None`. What is written, and how,
is the subclass's `_run`."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Generic, TypeVar

log = logging.getLogger("inferd.telemetry")

Item = TypeVar("Item")


class Flush:
    """A marker in the queue: everything offered before it is written once `done` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()


class WriterThread(Generic[Item]):
    """`_items` holds items, `Flush` markers and a final `None` (stop); `_run` drains it on
    the thread named `thread_name`. A deque, not a queue.Queue: an append wakes no thread,
    so the loop pays no handoff per item."""

    def __init__(self, thread_name: str, what: str) -> None:
        self._what = what  # for the log: what a stuck writer loses
        self._items: deque[Item | Flush | None] = deque()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait (never on the event loop) until what was offered so far is written."""
        marker = Flush()
        self._items.append(marker)
        self._wake.set()
        return marker.done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is pending and stop the thread."""
        if self._thread.is_alive():
            self._items.append(None)
            self._wake.set()
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("%s is stuck: %s", self._thread.name, self._what)

    def _run(self) -> None:
        raise NotImplementedError
