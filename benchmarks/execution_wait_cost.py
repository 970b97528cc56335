"""How a batch's thread hop can be awaited with a timeout, each way's cost per call: plain
`run_in_executor` (no timeout), `asyncio.wait` with a timeout, and inferd's `InstanceRun` (filled by
the thread, scheduling/instance_runs.py) without and with its `call_later` timer.

    .venv/bin/python benchmarks/execution_wait_cost.py --calls 5000 --rounds 15

The thread's work is nothing, so the figures are the hop itself; best and median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from inferd.scheduling.instance_runs import InstanceRun, wake

EXECUTOR = ThreadPoolExecutor(1)
TIMEOUT_S = 120.0


def nothing() -> int:
    return 1


async def plain(loop: asyncio.AbstractEventLoop) -> int:
    return await loop.run_in_executor(EXECUTOR, nothing)


async def with_wait(loop: asyncio.AbstractEventLoop) -> int:
    future = loop.run_in_executor(EXECUTOR, nothing)
    await asyncio.wait((future,), timeout=TIMEOUT_S)
    return future.result()


async def call(loop: asyncio.AbstractEventLoop) -> int:
    c: InstanceRun[int] = InstanceRun(loop, ("bench", "1", 0))
    EXECUTOR.submit(c.run, nothing)
    await c.woken
    return c.result()


async def call_with_timer(loop: asyncio.AbstractEventLoop) -> int:
    c: InstanceRun[int] = InstanceRun(loop, ("bench", "1", 0))
    EXECUTOR.submit(c.run, nothing)
    timer = loop.call_later(TIMEOUT_S, wake, c.woken)
    try:
        await c.woken
    finally:
        timer.cancel()
    return c.result()


WAYS: dict[str, Callable[[asyncio.AbstractEventLoop], Awaitable[int]]] = {
    "run_in_executor": plain,
    "run_in_executor + asyncio.wait": with_wait,
    "InstanceRun": call,
    "InstanceRun + call_later (inferd)": call_with_timer,
}


async def per_call_us(way: Callable[[asyncio.AbstractEventLoop], Awaitable[int]], n: int) -> float:
    loop = asyncio.get_running_loop()
    for _ in range(200):
        await way(loop)
    started = time.perf_counter()
    for _ in range(n):
        await way(loop)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(args.rounds):
        for name, way in WAYS.items():
            figures[name].append(asyncio.run(per_call_us(way, args.calls)))
    for name, values in figures.items():
        print(f"{name:32} best {min(values):6.1f} µs  median {statistics.median(values):6.1f} µs")


if __name__ == "__main__":
    main()
