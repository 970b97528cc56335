"""Concurrent identical misses run once: the first caller (the leader) runs its work inline,
the others wait on a future the leader settles with its result or its exception.

No task is made: a miss costs one future and no extra turns of the event loop. If the
leader is cancelled (a client gone, a deadline), its waiters get LeaderCancelledError: the
caller looks again (another waiter may have stored the answer meanwhile) and calls run()
again, where one of them leads with its own work. Nobody is left hanging. Keys
are whole CacheKeys (digest and description): two requests whose digests collide never
share a flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from inferd.cache.keys import CacheKey

T = TypeVar("T")


class LeaderCancelledError(Exception):
    """The flight's leader was cancelled before it had a result: look again, run again."""


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._flights: dict[CacheKey, asyncio.Future[T]] = {}
        self._joined: set[CacheKey] = set()  # flights someone waits on
        self.coalesced = 0  # times a caller waited on another caller's flight

    def __len__(self) -> int:
        return len(self._flights)

    def joined(self, key: CacheKey) -> bool:
        """Whether another caller waits on the key's current flight."""
        return key in self._joined

    async def run(self, key: CacheKey, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`'s result (or its exception), run once for all concurrent callers;
        LeaderCancelledError to a waiter whose leader was cancelled."""
        future = self._flights.get(key)
        if future is None:
            return await self._lead(key, work)
        self.coalesced += 1
        self._joined.add(key)
        # Shielded: a waiter's cancellation must not cancel the shared future.
        return await asyncio.shield(future)

    async def _lead(self, key: CacheKey, work: Callable[[], Awaitable[T]]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._flights[key] = future
        try:
            result = await work()
        except asyncio.CancelledError:
            self._settle(key, future, LeaderCancelledError())
            raise
        except BaseException as exc:
            self._settle(key, future, exc)
            raise
        # Before the waiters see it: a caller arriving after this starts a new flight
        # (and, with a local tier, finds the entry `work` has just stored).
        del self._flights[key]
        self._joined.discard(key)
        future.set_result(result)
        return result

    def _settle(self, key: CacheKey, future: asyncio.Future[T], exc: BaseException) -> None:
        del self._flights[key]
        self._joined.discard(key)
        future.set_exception(exc)
        future.exception()  # retrieved: no "never retrieved" log when nobody waited
