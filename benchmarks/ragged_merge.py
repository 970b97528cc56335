"""What the merge step costs a batch: ragged inputs with a batch input, against plain rows.

.venv/bin/python benchmarks/ragged_merge.py [requests per batch]

Times `scheduling.merge.merged_inputs` alone (no server, no model): the best of 15 rounds,
so the figure is the step's own cost rather than the shared machine's noise.
"""

from __future__ import annotations

import sys
import timeit

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.ragged_config import NO_RAGGED, BatchInputSpec, RaggedPlan
from inferd.scheduling.merge import merged_inputs
from inferd.tensors.signature import BoundRequest

ENDS = BatchInputSpec(
    mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT, ("INDEX",), np.dtype(np.int32), "IN"
)
RAGGED = RaggedPlan(frozenset({"IN"}), (ENDS,))


def best_us(requests: list[BoundRequest], plan: RaggedPlan, number: int = 5000) -> float:
    rounds = timeit.repeat(lambda: merged_inputs(requests, plan), number=number, repeat=15)
    return min(rounds) / number * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    ragged = [
        BoundRequest({"IN": np.ones((1, 64 + 8 * k), np.float32)}, 1, (), []) for k in range(n)
    ]
    rows = [BoundRequest({"IN": np.ones((1, 64), np.float32)}, 1, (), []) for _ in range(n)]
    print(f"{n} ragged requests, 64.. values each, + INDEX: {best_us(ragged, RAGGED):6.1f} us")
    print(f"{n} requests of [1, 64], rows concatenated:     {best_us(rows, NO_RAGGED):6.1f} us")


if __name__ == "__main__":
    main()
