"""Triton's per-model metric names (`--metrics-triton-names`), so its dashboards keep working.

Named, typed and labelled as Triton's own /metrics: counters without a `_total` suffix (the
exposition in metrics_endpoint.py keeps them typed as counters), durations in microseconds,
labels `model` and `version`, and `nv_inference_request_failure` split by Triton's
`reason`. They are read at scrape time from the numbers the statistics API serves
(`GET /v2/models/{m}/stats`), so the two always agree. docs/metrics.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.repository.registry import ModelRegistry
from inferd.telemetry.snapshots import items
from inferd.telemetry.statistics import StatisticsSink, VersionStats

# inferd's failure reason -> Triton's: REJECTED is a request its queue refused or timed
# out, CANCELED one the client gave up on, BACKEND one the model failed, OTHER the rest.
TRITON_REASON = {
    "rejected": "REJECTED",
    "timeout": "REJECTED",
    "cancelled": "CANCELED",
    "model_error": "BACKEND",
}
TRITON_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # each exported, 0 or not

# name -> (help, the value in a version's statistics)
_COUNTERS: dict[str, tuple[str, Callable[[VersionStats], int]]] = {
    "nv_inference_request_success": (
        "Number of successful inference requests, all batch sizes",
        lambda s: s.success.count,
    ),
    "nv_inference_count": (
        "Number of inferences performed (rows: a batch of n counts n)",
        lambda s: s.inference_count,
    ),
    "nv_inference_exec_count": (
        "Number of model executions performed (batches)",
        lambda s: s.execution_count,
    ),
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds",
        lambda s: s.success.ns // 1000,
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds",
        lambda s: s.queue.ns // 1000,
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative compute input duration in microseconds",
        lambda s: s.compute_input.ns // 1000,
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds",
        lambda s: s.compute_infer.ns // 1000,
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative inference compute output duration in microseconds",
        lambda s: s.compute_output.ns // 1000,
    ),
}
FAILURE = "nv_inference_request_failure"
# Exported for the versions whose model uses the response cache, as Triton does.
_CACHE_COUNTERS: dict[str, tuple[str, Callable[[VersionStats], int]]] = {
    "nv_cache_num_hits_per_model": (
        "Number of response cache hits per model",
        lambda s: s.cache_hit.count,
    ),
    "nv_cache_num_misses_per_model": (
        "Number of response cache misses per model",
        lambda s: s.cache_miss.count,
    ),
    "nv_cache_hit_duration_per_model": (
        "Cumulative time requests spend retrieving a cached response per model on cache hits "
        "(microseconds)",
        lambda s: s.cache_hit.ns // 1000,
    ),
    "nv_cache_miss_duration_per_model": (
        "Cumulative time requests spend looking up and inserting responses into the cache on "
        "a cache miss (microseconds)",
        lambda s: s.cache_miss.ns // 1000,
    ),
}


class TritonCollector(Collector):
    def __init__(
        self,
        registry: ModelRegistry,
        statistics: StatisticsSink,
        failures: dict[tuple[str, str, str], int],
    ) -> None:
        self._registry = registry
        self._statistics = statistics
        self._failures = failures  # MetricsSink's, by (model, version, inferd's reason)

    def collect(self) -> Iterator[Metric]:
        # Snapshots: the event loop adds keys to these dicts while this thread reads them.
        models = sorted(items(self._registry.models))
        ready = {(n, v) for n, m in models for v, mv in items(m.versions) if mv.is_ready}
        cached = {(n, v) for n, m in models for v, mv in items(m.versions) if mv.cache is not None}
        # Keys only: list() is safe (telemetry/snapshots.py); those the registry still holds
        # (a record that ended after its version's unload waits for the next one, unseen).
        held = self._registry.holds
        counted = [key for key in list(self._statistics.versions) if held(*key)]
        failures: dict[tuple[str, str, str], int] = {}
        for (model, version, reason), count in items(self._failures):
            if model and version:  # as the statistics: only requests a version accepted
                key = (model, version, TRITON_REASON.get(reason, "OTHER"))
                failures[key] = failures.get(key, 0) + count
        # Triton exports a version's series from its load on, at 0 until something happens,
        # and drops them at its unload.
        families = {name: Metric(name, doc, "counter") for name, (doc, _) in _COUNTERS.items()}
        failure = Metric(FAILURE, "Number of failed inference requests, all batch sizes", "counter")
        caches = {name: Metric(name, doc, "counter") for name, (doc, _) in _CACHE_COUNTERS.items()}
        empty = VersionStats()
        for model, version in sorted(ready.union(counted)):
            stats = self._statistics.versions.get((model, version), empty)  # get: no insert
            labels = {"model": model, "version": version}
            for name, (_, read) in _COUNTERS.items():
                families[name].add_sample(name, labels, float(read(stats)))
            for reason in TRITON_REASONS:
                count = failures.get((model, version, reason), 0)
                failure.add_sample(FAILURE, {**labels, "reason": reason}, float(count))
            if (model, version) in cached or stats.cache_hit.count or stats.cache_miss.count:
                for name, (_, read) in _CACHE_COUNTERS.items():
                    caches[name].add_sample(name, labels, float(read(stats)))
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=("model", "version"),
        )
        for name, entry in models:
            for version, mv in sorted(items(entry.versions)):
                if mv.batcher is not None:
                    pending.add_metric([name, version], mv.batcher.queue_depth())
        yield families["nv_inference_request_success"]
        yield failure
        yield from (f for name, f in families.items() if name != "nv_inference_request_success")
        yield pending
        yield from (f for f in caches.values() if f.samples)
