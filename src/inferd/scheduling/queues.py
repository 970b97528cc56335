"""The batcher's queue: one FIFO per priority level, read in priority order.

Triton's priority levels: 1 is the highest; a request without a priority gets the model's
default level. Each level has its own queue policy (size limit, timeout, action).

An entry that stops waiting (its client went away, its deadline passed) stays in its FIFO
until the batcher reaches it, so that leaving costs O(1); `left` takes it out of the counts
at once: `waiting` is what queue depth, limits and readiness read.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy for one priority level."""

    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False  # a request's `timeout` parameter may replace it
    reject_on_timeout: bool = True  # timeout_action REJECT (False: DELAY, keep waiting)


class PriorityQueues(Generic[T]):
    def __init__(self, levels: int) -> None:
        self._levels: list[deque[T]] = [deque() for _ in range(max(1, levels))]
        self._size = 0
        self.waiting = [0] * len(self._levels)  # live entries per level
        self.waiting_total = 0

    def append(self, item: T, level: int) -> None:
        self._levels[level].append(item)
        self._size += 1
        self.waiting[level] += 1
        self.waiting_total += 1

    def left(self, level: int) -> None:
        """An entry of `level` stopped waiting (taken into a batch, cancelled, expired);
        called once per entry."""
        self.waiting[level] -= 1
        self.waiting_total -= 1

    def head(self) -> T:
        for queue in self._levels:
            if queue:
                return queue[0]
        raise IndexError("the queue is empty")

    def popleft(self) -> T:
        for queue in self._levels:
            if queue:
                self._size -= 1
                return queue.popleft()
        raise IndexError("the queue is empty")

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[T]:
        return itertools.chain.from_iterable(self._levels)
