"""The batcher tests' harness: a fake instance that records its batches, scheduler options, a
request, and a runner that drives the batcher on its own event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from inferd.scheduling.batcher import BatchingOptions, DynamicBatcher
from inferd.tensors.signature import BoundRequest
from inferd.types import Array

GUARD_S = 10


async def outputs(batcher: DynamicBatcher, request: BoundRequest) -> dict[str, Array]:
    """Submit and keep only the outputs (not the execution timings)."""
    result, _ = await batcher.submit(request)
    return result  # a test that hangs fails after this long instead of blocking the run


class Instance:
    """Doubles IN into OUT and records every batch it executes."""

    device = "cpu"
    provider = "test"

    def __init__(
        self,
        gate: threading.Event | None = None,
        barrier: threading.Barrier | None = None,
        run: Callable[[dict[str, Array]], dict[str, Array]] | None = None,
        log: list[str] | None = None,
    ) -> None:
        self.gate = gate
        self.barrier = barrier
        self.run = run
        self.batches: list[Array] = []
        self.entered = threading.Event()
        self.closed = False
        self.log = log if log is not None else []

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        self.batches.append(inputs["IN"].copy())
        self.log.append("execute")
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(GUARD_S), "the test never opened the gate"
        if self.barrier is not None:
            self.barrier.wait(GUARD_S)
        if self.run is not None:
            return self.run(inputs)
        return {"OUT": inputs["IN"] * 2}

    def close(self) -> None:
        self.closed = True
        self.log.append("close")


def req(*values: float, width: int = 1) -> BoundRequest:
    """A request of len(values) rows; row i is `values[i]` repeated `width` times."""
    data = np.repeat(np.array(values, dtype=np.float32)[:, None], width, axis=1)
    return BoundRequest(
        inputs={"IN": data}, rows=len(values), shape_key=((width,),), output_names=["OUT"]
    )


def run(main: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        async with asyncio.timeout(GUARD_S):
            await main()

    asyncio.run(guarded())


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def options(**kwargs: Any) -> BatchingOptions:
    kwargs.setdefault("max_batch_size", 8)
    return BatchingOptions(**kwargs)
