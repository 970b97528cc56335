"""The response cache's Prometheus families (`inferd_cache_*`), built at scrape time from the
cache's per-tier counts (`TierStats`): nothing on the request path. docs/metrics.md and
docs/cache.md define them; Triton's `nv_cache_*` names are in triton_names.py."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from inferd.telemetry.snapshots import items

if TYPE_CHECKING:
    from inferd.cache.response_cache import ResponseCache
    from inferd.cache.tier_stats import LatencyHistogram, TierStats

# name (without _total) -> (help, the count in a tier's stats)
_TIER_COUNTERS: dict[str, tuple[str, Callable[[TierStats], int]]] = {
    "inferd_cache_errors": (
        "Cache calls that failed (Redis: timeouts, connection errors, corrupt values); the "
        "request ran the model instead.",
        lambda s: s.errors,
    ),
    "inferd_cache_evictions": (
        "Entries removed to make room (the tier's bytes or a model's cache_max_entries).",
        lambda s: s.evictions,
    ),
    "inferd_cache_inserts": ("Entries stored.", lambda s: s.inserts),
    "inferd_cache_expired": ("Entries found past their TTL (a miss).", lambda s: s.expired),
    "inferd_cache_stale_hits": (
        "A degraded model's lookups answered by an entry kept past its TTL (stale_s); not "
        "counted in inferd_cache_hits.",
        lambda s: s.stale_hits,
    ),
    "inferd_cache_oversize": (
        "Answers not stored: larger than cache_max_response_bytes or the tier.",
        lambda s: s.oversize,
    ),
    "inferd_cache_breaker_skips": (
        "Lookups not tried because the Redis lookups' breaker was open after failures.",
        lambda s: s.skipped,
    ),
    "inferd_cache_collisions": (
        "Lookups whose digest matched an entry of another request (served as a miss).",
        lambda s: s.collisions,
    ),
}
# name (without _total) -> (help, the count of each operation in a tier's stats)
_OPERATION_COUNTERS: dict[str, tuple[str, dict[str, Callable[[TierStats], int]]]] = {
    "inferd_cache_timeouts": (
        "Redis calls that ran out of their bound (lookups: timeout_ms, counted per lookup; "
        "inserts: insert_timeout_ms, per batch); counted in inferd_cache_errors too.",
        {"lookup": lambda s: s.lookup_timeouts, "insert": lambda s: s.insert_timeouts},
    ),
}
_TIER_GAUGES: dict[str, tuple[str, Callable[[TierStats], int]]] = {
    "inferd_cache_bytes": ("Bytes of the entries the tier holds.", lambda s: s.bytes),
    "inferd_cache_entries": ("Entries the tier holds.", lambda s: s.entries),
}


class CacheCollector(Collector):
    def __init__(self, cache: ResponseCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        tiers = self._cache.stats
        hits = CounterMetricFamily(
            "inferd_cache_hits",
            "Lookups answered by the tier, per model.",
            labels=("tier", "model"),
        )
        misses = CounterMetricFamily(
            "inferd_cache_misses",
            "Lookups the tier could not answer, per model.",
            labels=("tier", "model"),
        )
        for stats in tiers:
            for model, count in sorted(items(stats.hits_by_model)):
                hits.add_metric([stats.tier, model], count)
            for model, count in sorted(items(stats.misses_by_model)):
                misses.add_metric([stats.tier, model], count)
        yield hits
        yield misses
        for name, (doc, read) in _TIER_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=("tier",))
            for stats in tiers:
                family.add_metric([stats.tier], read(stats))
            yield family
        dropped = CounterMetricFamily(
            "inferd_cache_dropped_inserts",
            "Inserts not made, by reason: queue_full (the Redis insert queue), breaker_open "
            "(the inserts' breaker), failed (the write timed out or failed), unencodable.",
            labels=("tier", "reason"),
        )
        for stats in tiers:
            for reason, count in sorted(items(stats.dropped_by_reason)):
                dropped.add_metric([stats.tier, reason], count)
        yield dropped
        for name, (doc, reads) in _OPERATION_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=("tier", "operation"))
            for stats in tiers:
                if stats.tier == "redis":
                    for operation, read in reads.items():
                        family.add_metric([stats.tier, operation], read(stats))
            yield family
        yield from self._breakers()
        for name, (doc, read) in _TIER_GAUGES.items():
            gauge = GaugeMetricFamily(
                name,
                doc + " Redis: every process's entries under the tier's key prefix, as of "
                "the last count in Redis (absent while unknown).",
                labels=("tier",),
            )
            for stats in tiers:
                value = read(stats)
                if value >= 0:  # -1: unknown (Redis not counted yet, or could not be)
                    gauge.add_metric([stats.tier], value)
            yield gauge
        lookups = HistogramMetricFamily(
            "inferd_cache_lookup_seconds", "Time of one lookup in the tier.", labels=("tier",)
        )
        inserts = HistogramMetricFamily(
            "inferd_cache_insert_seconds",
            "Time of one insert into the tier (Redis: in the background).",
            labels=("tier",),
        )
        for stats in tiers:
            lookups.add_metric([stats.tier], *_buckets(stats.lookup_seconds))
            inserts.add_metric([stats.tier], *_buckets(stats.insert_seconds))
        yield lookups
        yield inserts
        coalesced = CounterMetricFamily(
            "inferd_cache_coalesced",
            "Requests answered by an identical concurrent request's execution, which they "
            "waited for instead of running (neither a hit nor a miss), per model.",
            labels=("model",),
        )
        # Every model the cache has looked up, at 0 until one of its requests waits.
        counts = dict(items(self._cache.coalesced_by_model))
        looked_up = {m for s in tiers for m in list(s.misses_by_model)}
        for model in sorted(looked_up.union(counts)):
            coalesced.add_metric([model], counts.get(model, 0))
        yield coalesced

    def _breakers(self) -> Iterator[Metric]:
        """The Redis tier's breakers, one per operation (lookup, insert)."""
        is_open = GaugeMetricFamily(
            "inferd_cache_breaker_open",
            "1 while the Redis tier's breaker of the operation is open or half-open: lookups "
            "skipped (a miss: the model runs), or inserts dropped (nothing shared).",
            labels=("tier", "operation"),
        )
        opens = CounterMetricFamily(
            "inferd_cache_breaker_opens",
            "Times the Redis tier's breaker of the operation opened.",
            labels=("tier", "operation"),
        )
        redis = self._cache.redis
        if redis is not None:
            for operation, breaker in redis.breakers.items():
                is_open.add_metric(["redis", operation], 1 if breaker.is_open else 0)
                opens.add_metric(["redis", operation], breaker.opens)
        yield is_open
        yield opens


def _buckets(histogram: LatencyHistogram) -> tuple[list[tuple[str, float]], float]:
    """Prometheus' cumulative buckets (and the sum) from the tier's per-bucket counts."""
    counts = list(histogram.counts)  # a copy: the loop observes meanwhile
    bounds = [*histogram.BUCKETS, math.inf]
    cumulative, buckets = 0, []
    for bound, count in zip(bounds, counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if math.isinf(bound) else repr(bound), float(cumulative)))
    return buckets, histogram.total
