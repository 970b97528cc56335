"""Concurrent identical misses run once: the first caller's work runs in a task of its own,
and every caller with the same key (the first included) awaits that task.

The task, not the first caller, owns the work, so cancelling the first caller (a client gone,
a deadline) does not cancel it under the others; it is cancelled only when every caller
waiting on it has gone. Keys are whole CacheKeys (digest and description), so two requests
whose digests collide never share a flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from inferd.cache.keys import CacheKey

T = TypeVar("T")


@dataclass(eq=False)
class _Flight(Generic[T]):
    task: asyncio.Task[T]
    waiters: int = 0


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._flights: dict[CacheKey, _Flight[T]] = {}
        self.coalesced = 0  # callers served by another caller's flight

    def __len__(self) -> int:
        return len(self._flights)

    def joined(self, key: CacheKey) -> bool:
        return key in self._flights

    async def run(self, key: CacheKey, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`'s result (or its exception), run once for all concurrent callers."""
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(self._owned(key, work)))
            flight.task.add_done_callback(_retrieve)
            self._flights[key] = flight
        else:
            self.coalesced += 1
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if flight.waiters == 1 and not flight.task.done():
                # Nobody else waits for it: stop it, and let a later caller start afresh
                # rather than join work that is being cancelled.
                self._forget(key, flight.task)
                flight.task.cancel()
            raise
        finally:
            flight.waiters -= 1

    async def _owned(self, key: CacheKey, work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        finally:
            # Before the result is seen: a caller arriving after this starts a new flight
            # (and, with a local tier, finds the entry `work` has just stored).
            task = asyncio.current_task()
            if task is not None:
                self._forget(key, task)

    def _forget(self, key: CacheKey, task: asyncio.Task[T]) -> None:
        flight = self._flights.get(key)
        if flight is not None and flight.task is task:
            del self._flights[key]


def _retrieve(task: asyncio.Task[object]) -> None:
    """Mark an exception retrieved even when every caller has gone (no 'never retrieved')."""
    if not task.cancelled():
        task.exception()
