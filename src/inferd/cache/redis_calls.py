"""How the Redis tier calls Redis: lookups made in the same turn of the event loop go out
together as one MGET, and a cancel redis-py swallowed is raised again.

One MGET of 64 keys costs a small part of 64 concurrent GETs (measured on the machine's
Redis: 8-17 us a key against 80-165 us, and one connection instead of 64), and a lone
lookup waits for nothing but the end of the current turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

MAX_KEYS = 256  # per MGET; more pending lookups go out as several


def cancels() -> int:
    """The current task's count of pending cancels (0 outside a task)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def reraise_swallowed_cancel(before: int) -> None:
    """redis-py (8.1 seen) can return normally from a call its task was cancelled in. The
    cancellation must still win (a request's, the insert worker's: else asyncio.run's
    shutdown waits on the worker for ever). Only a cancel that came during the call counts:
    `before` is the task's count of pending cancels when it began (a timeout's own cancel
    is withdrawn by asyncio.timeout, so it does not count)."""
    if cancels() > before:
        raise asyncio.CancelledError


class LookupBatcher:
    def __init__(self, client: Any, timeout_s: float, max_keys: int = MAX_KEYS) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.max_keys = max_keys
        self.batches = 0  # MGETs sent
        self._pending: list[tuple[str, asyncio.Future[bytes | None]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def get(self, name: str) -> bytes | None:
        """The value at `name` (None: no such key); Redis's failure raised as is."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes | None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._send)  # at the end of this turn, with whoever joined
        self._pending.append((name, future))
        return await future

    def _send(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self.max_keys):
            task = asyncio.create_task(self._mget(pending[start : start + self.max_keys]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _mget(self, batch: list[tuple[str, asyncio.Future[bytes | None]]]) -> None:
        live = [(name, future) for name, future in batch if not future.done()]
        if not live:
            return  # every caller gone (cancelled, timed out) before the turn ended
        self.batches += 1
        before = cancels()
        try:
            async with asyncio.timeout(self.timeout_s):
                values = await self.client.mget([name for name, _ in live])
            reraise_swallowed_cancel(before)
        except asyncio.CancelledError:
            for _, future in live:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # each caller raises it; none is left unretrieved
            return
        for (_, future), value in zip(live, values, strict=True):
            if not future.done():
                future.set_result(value)

    async def close(self) -> None:
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
