"""Prometheus metrics: every inferd_* metric is defined here and nowhere else.

A telemetry sink for what happens per request and per batch, plus a collector that reads the
registry's state at scrape time (queue depths, model states, devices, health), so nothing on
the request path pays for gauges. docs/metrics.md defines each metric.
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from inferd.events import BatchRecord, RequestRecord
from inferd.repository.config import backend_name, parameter
from inferd.repository.registry import ModelRegistry, State
from inferd.statistics import StatisticsSink

log = logging.getLogger("inferd.metrics")

# The *_created series double every counter's output for a feature few queries use.
disable_created_metrics()  # type: ignore[no-untyped-call]

# 0.1 ms .. 10 s: from a tiny model's queue wait to a slow model's whole request.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
GC_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)

HEALTH_WINDOW_S = 60.0
HEALTH_BASELINE_FACTOR = 4.0  # default p99 baseline: 4x the best windowed p99 seen
MV = ("model", "version")


@dataclass(slots=True)
class _Window:
    """Recent outcomes of one model version, for its health score."""

    samples: deque[tuple[float, float, bool]] = field(default_factory=lambda: deque(maxlen=100_000))
    best_p99_s: float = 0.0
    max_throughput: float = 0.0


class _Histogram:
    """A Prometheus histogram's state, updated from the event loop only (no lock needed):
    observing is one bisect and two additions, several times cheaper than
    prometheus_client's locked histograms on this hot path."""

    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1  # le: value <= bound
        self.total += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        counts, total = list(self.counts), self.total  # one consistent snapshot
        out, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out, total


class _Series:
    """Everything counted per model version, in plain numbers."""

    __slots__ = (
        "success", "inferences", "executions", "duration", "queue", "compute_input",
        "compute_infer", "compute_output", "batch_size",
    )  # fmt: skip

    def __init__(self) -> None:
        self.success = 0
        self.inferences = 0
        self.executions = 0
        self.duration = _Histogram(LATENCY_BUCKETS_S)
        self.queue = _Histogram(LATENCY_BUCKETS_S)
        self.compute_input = _Histogram(LATENCY_BUCKETS_S)
        self.compute_infer = _Histogram(LATENCY_BUCKETS_S)
        self.compute_output = _Histogram(LATENCY_BUCKETS_S)
        self.batch_size = _Histogram(tuple(float(b) for b in BATCH_BUCKETS))


# (name, help) of the per-version histograms, in _Series attribute order.
HISTOGRAMS = {
    "duration": ("inferd_request_duration_seconds", "End-to-end time of successful requests."),
    "queue": ("inferd_queue_duration_seconds", "Time a request waited in the queue for a batch."),
    "compute_input": (
        "inferd_compute_input_duration_seconds",
        "Time merging a request's batch inputs.",
    ),
    "compute_infer": (
        "inferd_compute_infer_duration_seconds",
        "Model execution time of a request's batch.",
    ),
    "compute_output": (
        "inferd_compute_output_duration_seconds",
        "Time splitting and checking a request's outputs.",
    ),
    "batch_size": ("inferd_batch_size", "Rows per executed batch."),
}


class MetricsSink:
    def __init__(
        self,
        registry: ModelRegistry,
        statistics: StatisticsSink,
        triton_names: bool = False,
        prometheus: CollectorRegistry | None = None,
    ) -> None:
        self.prometheus = prometheus or CollectorRegistry()
        r = self.prometheus
        self.series: dict[tuple[str, str], _Series] = {}
        self.failures: dict[tuple[str, str, str], int] = {}
        self.batch_closes: dict[tuple[str, str, str], int] = {}
        # GC callbacks run on whichever thread collects: this one keeps its lock.
        self.gc_pause = Histogram(
            "inferd_gc_pause_seconds",
            "Pauses of Python's garbage collector.",
            ("generation",),
            buckets=GC_BUCKETS_S,
            registry=r,
        )
        self._windows: dict[tuple[str, str], _Window] = {}
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        r.register(_CountsCollector(self))
        r.register(_StateCollector(registry, self, statistics, triton_names))
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total
        GCCollector(registry=r)
        PlatformCollector(registry=r)

    def _series(self, model: str, version: str) -> _Series:
        key = (model, version)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = _Series()
        return series

    def on_request(self, record: RequestRecord) -> None:
        model, version = record.model, record.version
        if record.failure is not None:
            key = (model, version, record.failure)
            self.failures[key] = self.failures.get(key, 0) + 1
            if model and version:
                self._window(model, version).samples.append(
                    (time.monotonic(), record.duration_ns / 1e9, False)
                )
            return
        c = self._series(model, version)
        c.success += 1
        seconds = record.duration_ns / 1e9
        c.duration.observe(seconds)
        times = record.times
        if times is not None:
            c.queue.observe(times.queue_ns / 1e9)
            c.compute_input.observe(times.compute_input_ns / 1e9)
            c.compute_infer.observe(times.compute_infer_ns / 1e9)
            c.compute_output.observe(times.compute_output_ns / 1e9)
        self._window(model, version).samples.append((time.monotonic(), seconds, True))

    def on_batch(self, record: BatchRecord) -> None:
        key = (record.model, record.version, record.close_reason)
        self.batch_closes[key] = self.batch_closes.get(key, 0) + 1
        if not record.failed:
            c = self._series(record.model, record.version)
            c.inferences += record.rows  # with its execution, like the statistics API
            c.executions += 1
            c.batch_size.observe(record.rows)

    def _window(self, model: str, version: str) -> _Window:
        key = (model, version)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window()
        return window

    def health_score(self, model: str, version: str, baseline_s: float | None) -> float:
        """0.4·(1 − min(1, p99/baseline)) + 0.3·min(1, throughput/max) + 0.3·(1 − errors).

        Over the last HEALTH_WINDOW_S seconds; see docs/metrics.md for the baseline.
        """
        window = self._window(model, version)
        now = time.monotonic()
        samples = window.samples
        while samples and samples[0][0] < now - HEALTH_WINDOW_S:
            samples.popleft()
        if not samples:
            return 0.7  # idle: no latency or error problem, no throughput
        ok = sorted(latency for _, latency, success in samples if success)
        errors = len(samples) - len(ok)
        p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else 0.0
        if ok and (window.best_p99_s == 0.0 or p99 < window.best_p99_s):
            window.best_p99_s = p99
        baseline = baseline_s or window.best_p99_s * HEALTH_BASELINE_FACTOR
        span_s = max(1.0, min(HEALTH_WINDOW_S, now - samples[0][0]))
        throughput = len(ok) / span_s
        window.max_throughput = max(window.max_throughput, throughput)
        latency_term = 1.0
        if not ok:
            latency_term = 0.0  # every request failed: no latency to be proud of
        elif baseline > 0:
            latency_term = 1 - min(1.0, p99 / baseline)
        throughput_term = (
            min(1.0, throughput / window.max_throughput) if window.max_throughput else 0.0
        )
        return 0.4 * latency_term + 0.3 * throughput_term + 0.3 * (1 - errors / len(samples))

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self.gc_pause.labels(str(info.get("generation", ""))).observe(
                time.perf_counter() - self._gc_started
            )

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


class _CountsCollector(Collector):
    """Exports what MetricsSink counted, as Prometheus counters and native histograms."""

    def __init__(self, sink: MetricsSink) -> None:
        self._sink = sink

    def collect(self) -> Iterator[Metric]:
        sink = self._sink
        success = CounterMetricFamily(
            "inferd_request_success", "Requests answered successfully.", labels=MV
        )
        inferences = CounterMetricFamily(
            "inferd_inference_count", "Rows inferred (a request may carry several).", labels=MV
        )
        executions = CounterMetricFamily(
            "inferd_execution_count", "Batches executed by the model.", labels=MV
        )
        histograms = {
            attr: HistogramMetricFamily(name, doc, labels=MV)
            for attr, (name, doc) in HISTOGRAMS.items()
        }
        for (model, version), series in sorted(sink.series.items()):
            labels = [model, version]
            success.add_metric(labels, series.success)
            inferences.add_metric(labels, series.inferences)
            executions.add_metric(labels, series.executions)
            for attr, family in histograms.items():
                buckets, total = getattr(series, attr).cumulative()
                family.add_metric(labels, buckets, total)
        failure = CounterMetricFamily(
            "inferd_request_failure", "Requests that failed, by reason.", labels=(*MV, "reason")
        )
        for key, count in sorted(dict(sink.failures).items()):
            failure.add_metric(list(key), count)
        close = CounterMetricFamily(
            "inferd_batch_close",
            "Why each batch left the queue: full, preferred_size, max_delay, "
            "shape_mismatch, queue_empty.",
            labels=(*MV, "reason"),
        )
        for key, count in sorted(dict(sink.batch_closes).items()):
            close.add_metric(list(key), count)
        yield from (success, failure, inferences, executions, close, *histograms.values())


class _StateCollector(Collector):
    """Gauges read from the registry at scrape time, and Triton's names from the statistics."""

    def __init__(
        self,
        registry: ModelRegistry,
        sink: MetricsSink,
        statistics: StatisticsSink,
        triton_names: bool,
    ) -> None:
        self._registry = registry
        self._sink = sink
        self._statistics = statistics
        self._triton_names = triton_names

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("inferd_queue_depth", "Requests waiting for a batch.", labels=MV)
        inflight = GaugeMetricFamily(
            "inferd_inflight_requests", "Requests queued or executing.", labels=MV
        )
        state = GaugeMetricFamily(
            "inferd_model_state",
            "1 for the state a model version is in (LOADING, READY, UNAVAILABLE, UNLOADING).",
            labels=(*MV, "state"),
        )
        load = GaugeMetricFamily(
            "inferd_model_load_duration_seconds", "Time the version took to load.", labels=MV
        )
        info = GaugeMetricFamily(
            "inferd_model_info",
            "Always 1: the backend, device and provider each model version actually runs on.",
            labels=(*MV, "backend", "device", "provider"),
        )
        warmup = GaugeMetricFamily(
            "inferd_model_warmup_duration_seconds",
            "Time the version's warm-up took before it became READY.",
            labels=MV,
        )
        weight = GaugeMetricFamily(
            "inferd_routing_weight",
            "Canary routing weight of a version (absent: the default route).",
            labels=MV,
        )
        rollbacks = CounterMetricFamily(
            "inferd_canary_rollbacks",
            "Automatic canary rollbacks (weight set to 0 by the canary guard).",
            labels=MV,
        )
        circuit_open = GaugeMetricFamily(
            "inferd_circuit_open",
            "1 while the model's circuit breaker is open or half-open (requests fail fast "
            "or go to the fallback model).",
            labels=("model",),
        )
        circuit_opens = CounterMetricFamily(
            "inferd_circuit_opens", "Times the model's circuit breaker opened.", labels=("model",)
        )
        load_failures = CounterMetricFamily(
            "inferd_model_load_failures",
            "Loads or reloads of a model that failed (a working version kept serving).",
            labels=("model",),
        )
        health = GaugeMetricFamily(
            "inferd_health_score",
            "0..1 health of a model version over the last 60 s (see docs/metrics.md).",
            labels=MV,
        )
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count", "Triton: requests queued.", labels=MV
        )
        for name, model in sorted(self._registry.models.items()):
            load_failures.add_metric([name], model.load_failures)
            if model.circuit.policy.enabled:
                circuit_open.add_metric([name], 1.0 if model.circuit.is_open else 0.0)
                circuit_opens.add_metric([name], model.circuit.opens)
            for v, w in sorted(model.router.weights.items()):
                weight.add_metric([name, v], w)
            for v, count in sorted(model.router.rollbacks.items()):
                rollbacks.add_metric([name, v], count)
            for v, mv in sorted(model.versions.items()):
                labels = [name, v]
                for s in State:
                    state.add_metric([*labels, s.value], 1.0 if mv.state is s else 0.0)
                if mv.state is State.READY or mv.batcher is not None:
                    load.add_metric(labels, mv.load_duration_s)
                    warmup.add_metric(labels, mv.warmup_duration_s)
                    pairs = sorted(set(zip(mv.devices, mv.providers, strict=True)))
                    for device, provider in pairs or [("unknown", "unknown")]:
                        info.add_metric([*labels, backend_name(mv.config), device, provider], 1.0)
                if mv.batcher is not None:
                    depth.add_metric(labels, mv.batcher.queue_depth())
                    inflight.add_metric(labels, mv.batcher.inflight())
                    pending.add_metric(labels, mv.batcher.queue_depth())
                if mv.is_ready:
                    raw = parameter(mv.config, "health_p99_baseline_ms", "")
                    baseline = float(raw) / 1000 if raw else None
                    health.add_metric(labels, self._sink.health_score(name, v, baseline))
        yield from (depth, inflight, state, load, warmup, info, health)
        yield from (weight, rollbacks, load_failures, circuit_open, circuit_opens)
        if self._triton_names:
            yield pending
            yield from self._triton_counters()

    def _triton_counters(self) -> Iterator[Metric]:
        """Triton's counter names, cumulative like Triton's (microseconds, no _total)."""
        names = {
            "nv_inference_request_success": "Number of successful inference requests",
            "nv_inference_request_failure": "Number of failed inference requests",
            "nv_inference_count": "Number of inferences performed",
            "nv_inference_exec_count": "Number of model executions performed",
            "nv_inference_request_duration_us": "Cumulative inference request duration in us",
            "nv_inference_queue_duration_us": "Cumulative inference queuing duration in us",
            "nv_inference_compute_input_duration_us": "Cumulative compute input duration in us",
            "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in us",
            "nv_inference_compute_output_duration_us": "Cumulative compute output duration in us",
        }
        # Typed "unknown": the text format would print a counter's TYPE line with `_total`,
        # which Triton's names don't carry; rate() works on them either way.
        families = {n: Metric(n, doc, "unknown") for n, doc in names.items()}
        for (model, version), s in sorted(self._statistics.versions.items()):
            labels = {"model": model, "version": version}
            values = {
                "nv_inference_request_success": s.success.count,
                "nv_inference_request_failure": s.fail.count,
                "nv_inference_count": s.inference_count,
                "nv_inference_exec_count": s.execution_count,
                "nv_inference_request_duration_us": s.success.ns // 1000,
                "nv_inference_queue_duration_us": s.queue.ns // 1000,
                "nv_inference_compute_input_duration_us": s.compute_input.ns // 1000,
                "nv_inference_compute_infer_duration_us": s.compute_infer.ns // 1000,
                "nv_inference_compute_output_duration_us": s.compute_output.ns // 1000,
            }
            for n, value in values.items():
                families[n].add_sample(n, labels, float(value))
        yield from families.values()
