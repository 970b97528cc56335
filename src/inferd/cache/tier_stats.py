"""What each cache tier counts: the numbers /metrics and the statistics API read."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


class LatencyHistogram:
    """Fixed buckets in seconds, cheap to observe: counts per bucket (the last one past the
    largest bound: +Inf), their sum and count. Not cumulative: a Prometheus view sums them."""

    BUCKETS: tuple[float, ...] = (
        0.00001,
        0.000025,
        0.00005,
        0.0001,
        0.00025,
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
    )

    def __init__(self) -> None:
        self.counts: list[int] = [0] * (len(self.BUCKETS) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1


@dataclass
class TierStats:
    tier: str  # "local" or "redis"
    hits: int = 0
    misses: int = 0
    errors: int = 0  # redis: timeouts, connection errors, corrupt or foreign values
    evictions: int = 0  # local: entries removed to make room (bytes or per-model bound)
    inserts: int = 0
    dropped_inserts: int = 0  # redis: not written (dropped_by_reason says why)
    # Current. Redis: the whole tier's, as of the last count in Redis (redis_usage.py); -1
    # while unknown.
    bytes: int = 0
    entries: int = 0
    lookup_seconds: LatencyHistogram = field(default_factory=LatencyHistogram)
    insert_seconds: LatencyHistogram = field(default_factory=LatencyHistogram)
    hits_by_model: dict[str, int] = field(default_factory=dict)
    misses_by_model: dict[str, int] = field(default_factory=dict)
    # Added to the shared interface:
    expired: int = 0  # local: entries dropped at lookup because their TTL passed
    oversize: int = 0  # responses not stored: over the tier's size or max_response_bytes
    skipped: int = 0  # redis: lookups not tried because the breaker was open
    collisions: int = 0  # same digest, different description: served as a miss
    # A degraded model's lookups answered by an entry kept past its TTL (stale_s): counted
    # here only, not in `hits` (docs/cache.md, "Stale entries").
    stale_hits: int = 0
    # redis: calls that ran out of their bound (timeout_ms, insert_timeout_ms); in `errors` too
    lookup_timeouts: int = 0
    insert_timeouts: int = 0  # batches
    # redis: dropped inserts by reason: queue_full, breaker_open, failed (the write timed out
    # or failed), unencodable
    dropped_by_reason: dict[str, int] = field(default_factory=dict)

    def hit(self, model: str) -> None:
        self.hits += 1
        self.hits_by_model[model] = self.hits_by_model.get(model, 0) + 1

    def miss(self, model: str) -> None:
        self.misses += 1
        self.misses_by_model[model] = self.misses_by_model.get(model, 0) + 1

    def dropped(self, reason: str, count: int = 1) -> None:
        self.dropped_inserts += count
        self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + count
