"""What the execution timeout costs per batch: a DynamicBatcher over an instance that answers
at once, one request at a time, with the timeout off (0) and on (120 s, the default).

    .venv/bin/python benchmarks/execution_timeout_cost.py --requests 20000 --rounds 5

Rounds alternate off/on so that a change in the machine's load hits both; the figures are
the best and the median over rounds of the mean time per request (submit to answer, the
thread hop included). On a shared machine the best round is the steadier estimate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from inferd.scheduling.batcher import BatchingOptions, DynamicBatcher
from inferd.tensors.signature import BoundRequest
from inferd.types import Array


class Instant:
    device = "cpu"
    provider = "bench"

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        return {"OUT": inputs["IN"]}

    def close(self) -> None:
        pass


async def per_request_us(timeout_s: float, requests: int) -> float:
    batcher = DynamicBatcher(
        "bench", [Instant()], BatchingOptions(max_batch_size=8), "1", execution_timeout_s=timeout_s
    )
    request = BoundRequest(
        inputs={"IN": np.zeros((1, 4), np.float32)}, rows=1, shape_key=((4,),), output_names=["OUT"]
    )
    for _ in range(200):  # warm the thread and the loop
        await batcher.submit(request)
    started = time.perf_counter()
    for _ in range(requests):
        await batcher.submit(request)
    elapsed = time.perf_counter() - started
    await batcher.stop()
    return elapsed / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for label, timeout_s in (("off", 0.0), ("on", 120.0)):
            figures[label].append(asyncio.run(per_request_us(timeout_s, args.requests)))
    for name, pick in (("best", min), ("median", statistics.median)):
        off, on = (pick(figures[k]) for k in ("off", "on"))
        print(f"{name}: timeout off {off:.1f} µs/request, on {on:.1f} µs/request ({on - off:+.1f})")


if __name__ == "__main__":
    main()
