"""What the cache tests share: keys, outputs, and a counting model call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from inferd.cache import CacheKey, cache_key
from inferd.types import Tensor


def key(n: float, model: str = "m") -> CacheKey:
    x = Tensor("x", "FP32", (1,), np.array([n], dtype=np.float32))
    return cache_key(model, "1", [x], None, {})


def outputs(n: float, size: int = 4) -> list[Tensor]:
    return [Tensor("y", "FP32", (size,), np.full(size, n, dtype=np.float32))]


@dataclass
class Model:
    """A model call that counts its runs; `gate` (set by default) holds them when cleared."""

    calls: int = 0
    fail: Exception | None = None
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def run(self, n: float, size: int = 4):
        async def call() -> list[Tensor]:
            self.calls += 1
            self.started.set()
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return outputs(n, size)

        return call


async def wait_for(condition, timeout_s: float = 10.0) -> None:
    """Yield to the loop until `condition()` holds (a deadline, never a fixed sleep)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0)
