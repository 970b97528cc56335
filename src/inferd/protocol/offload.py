"""Where large requests are decoded and large responses encoded: off the event loop.

A 61 MiB request of 16 million BYTES elements, decoded on the event loop, kept every other
client (health probes included) waiting for its 24 s. Work on a large message goes to a
codec thread instead: the pure-Python parts of decoding (the BYTES walk, the per-element
checks) give the interpreter lock back every switch interval (5 ms), so the loop keeps
serving and the large request delays only itself.

JSON is different: orjson parses a document in one C call that holds the interpreter lock
throughout (59 MiB of zeros: 1.4 s, then 1 s more to make an array of the list), so a thread
would stall the loop just the same. Large JSON documents are parsed in a helper process
(spawned on first use); the decoded tensors come back pickled, one copy each.

Below the threshold everything runs inline: a hop to a thread costs more than small work.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from inferd.errors import ErrorKind, InferdError

log = logging.getLogger("inferd.offload")

T = TypeVar("T")


class Offload:
    def __init__(self, threshold_bytes: int, threads: int = 2) -> None:
        self.threshold_bytes = threshold_bytes
        self._threads = threads
        self._thread_pool: ThreadPoolExecutor | None = None
        self._process_pool: ProcessPoolExecutor | None = None
        self.running = 0  # calls in progress off the loop (tests order probes against it)

    def is_large(self, size: int) -> bool:
        return size >= self.threshold_bytes

    async def run(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`: inline when `size` (bytes) is below the threshold, else on a codec
        thread."""
        if size < self.threshold_bytes:
            return fn(*args)
        if self._thread_pool is None:
            self._thread_pool = ThreadPoolExecutor(self._threads, thread_name_prefix="codec")
        return await self._off_loop(self._thread_pool, fn, *args)

    async def run_gil_bound(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` for work that holds the interpreter lock in long C calls (orjson):
        inline below the threshold, else in a helper process. `fn` and its arguments and
        result must pickle; an InferdError it raises reaches the caller as such."""
        if size < self.threshold_bytes:
            return fn(*args)
        if self._process_pool is None:
            self._process_pool = ProcessPoolExecutor(
                max_workers=min(self._threads, os.cpu_count() or 1),
                mp_context=multiprocessing.get_context("spawn"),  # the server has threads
            )
        pool = self._process_pool
        try:
            outcome = await self._off_loop(pool, _call_reporting_errors, fn, *args)
        except BrokenProcessPool:
            # The helper died (killed, out of memory): this request fails, the next one
            # gets a fresh helper.
            if self._process_pool is pool:
                self._process_pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            log.error("the JSON decoding helper process died; starting a new one")
            raise InferdError(
                ErrorKind.INTERNAL, "the process decoding this request's JSON died"
            ) from None
        if isinstance(outcome, _Failure):
            raise InferdError(ErrorKind(outcome.kind), outcome.message)
        result: T = outcome
        return result

    async def _off_loop(self, executor: Executor, fn: Callable[..., T], *args: Any) -> T:
        self.running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                executor, functools.partial(fn, *args)
            )
        finally:
            self.running -= 1

    def close(self) -> None:
        if self._thread_pool is not None:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)
            self._thread_pool = None
        if self._process_pool is not None:
            self._process_pool.shutdown(wait=False, cancel_futures=True)
            self._process_pool = None


class _Failure:
    """An InferdError as it crosses the process boundary (its constructor takes two
    arguments, which exception pickling does not preserve)."""

    __slots__ = ("kind", "message")

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Failure, (self.kind, self.message))


def _call_reporting_errors(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except InferdError as exc:
        return _Failure(exc.kind.value, exc.message)
