"""What a model's batches were, as a user reads it: Triton's statistics API over HTTP.

Tests that check how requests were batched read this (or the `inferd_batch_close` metric),
never the scheduler's internals.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import httpx

from tests.support.servers import RunningServer


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    executions: int  # execution_count
    inferences: int  # inference_count (rows)
    sizes: Counter[int]  # batch size (rows) -> executions of that size (batch_stats)

    def __sub__(self, before: BatchStatistics) -> BatchStatistics:
        sizes = self.sizes.copy()
        sizes.subtract(before.sizes)
        return BatchStatistics(
            self.executions - before.executions,
            self.inferences - before.inferences,
            +sizes,  # drops the sizes that did not change
        )


def batch_statistics(server: RunningServer, model: str) -> BatchStatistics:
    doc = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=30).json()
    (stats,) = doc["model_stats"]
    sizes = Counter(
        {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    )
    return BatchStatistics(int(stats["execution_count"]), int(stats["inference_count"]), sizes)
