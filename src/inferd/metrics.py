"""Prometheus metrics: every inferd_* metric is defined here and nowhere else.

A telemetry sink for what happens per request and per batch, plus a collector that reads the
registry's state at scrape time (queue depths, model states, devices, health), so nothing on
the request path pays for gauges. docs/metrics.md defines each metric.

Scrapes run on the metrics server's threads while the event loop records, so collectors
read the dicts it adds keys to through snapshots.items() and the health windows through
their lock (health.py), never by iterating a live container (issue #13).
Triton's names live in metrics_triton.py, the host's CPU and GPUs in host_metrics.py, the
endpoint in metrics_http.py.
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from collections.abc import Iterator
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
from inferd.health import IDLE_SCORE, HealthWindow
from inferd.host_metrics import GpuCollector, register_host_metrics
from inferd.metrics_load import LoadCollector
from inferd.metrics_triton import TritonCollector
from inferd.repository.config import backend_name, parameter
from inferd.repository.registry import ModelRegistry, State
from inferd.scheduling.sequence_batcher import SequenceBatcher
from inferd.snapshots import items
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

MV = ("model", "version")


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
        host_metrics: bool = True,
    ) -> None:
        """`host_metrics`: with `triton_names`, also the host's nv_cpu_* and nv_gpu_* (off in
        a --workers worker: the supervisor exports the host once)."""
        self.prometheus = prometheus or CollectorRegistry()
        r = self.prometheus
        self.series: dict[tuple[str, str], _Series] = {}
        self.failures: dict[tuple[str, str, str], int] = {}
        # Decoupled models: (responses sent to clients, responses dropped) per version.
        self.stream_responses: dict[tuple[str, str], list[int]] = {}
        self.batch_closes: dict[tuple[str, str, str], int] = {}
        self.execution_timeouts: dict[tuple[str, str], int] = {}
        # Failed batches executed again in parts: [batches, executions] (scheduling/isolate.py).
        self.bisections: dict[tuple[str, str], list[int]] = {}
        # GC callbacks run on whichever thread collects: this one keeps its lock.
        self.gc_pause = Histogram(
            "inferd_gc_pause_seconds",
            "Pauses of Python's garbage collector.",
            ("generation",),
            buckets=GC_BUCKETS_S,
            registry=r,
        )
        self._windows: dict[tuple[str, str], HealthWindow] = {}
        self._gpus: GpuCollector | None = None
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        r.register(_CountsCollector(self))
        r.register(_StateCollector(registry, self))
        r.register(LoadCollector(registry))
        if triton_names:
            r.register(TritonCollector(registry, statistics, self.failures))
            if host_metrics:
                self._gpus = register_host_metrics(r)
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
        if record.responses is not None and model and version:
            counts = self.stream_responses.setdefault((model, version), [0, 0])
            counts[0] += sum(1 for r in record.responses if r.kind in ("success", "fail"))
            counts[1] += record.dropped
        if record.failure is not None:
            key = (model, version, record.failure)
            self.failures[key] = self.failures.get(key, 0) + 1
            if model and version:
                self._window(model, version).record(record.duration_ns / 1e9, False)
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
        self._window(model, version).record(seconds, True)

    def on_batch(self, record: BatchRecord) -> None:
        key = (record.model, record.version, record.close_reason)
        self.batch_closes[key] = self.batch_closes.get(key, 0) + 1
        if record.timed_out:
            labels = (record.model, record.version)
            self.execution_timeouts[labels] = self.execution_timeouts.get(labels, 0) + 1
        if record.bisect_executions:
            counts = self.bisections.setdefault((record.model, record.version), [0, 0])
            counts[0] += 1
            counts[1] += record.bisect_executions
        if not record.failed:
            c = self._series(record.model, record.version)
            c.inferences += record.rows  # with its execution, like the statistics API
            c.executions += 1
            c.batch_size.observe(record.rows)

    def _window(self, model: str, version: str) -> HealthWindow:
        key = (model, version)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = HealthWindow()
        return window

    def keep_windows(self, live: set[tuple[str, str]]) -> None:
        """Drop the health windows of versions that are gone (from a scrape thread): an
        unloaded version's window would otherwise keep its samples for good, one more per
        version number a model ever had. Popping a key is atomic; the loop only adds."""
        for key in list(self._windows):
            if key not in live:
                self._windows.pop(key, None)

    def health_score(self, model: str, version: str, baseline_s: float | None) -> float:
        """The version's health score over the last minute (docs/metrics.md); from a scrape
        thread, so it reads the window without creating one (only the loop adds windows)."""
        window = self._windows.get((model, version))
        return IDLE_SCORE if window is None else window.score(baseline_s)

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
        if self._gpus is not None:
            self._gpus.close()


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
        for (model, version), series in sorted(items(sink.series)):
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
        for key, count in sorted(items(sink.failures)):
            failure.add_metric(list(key), count)
        close = CounterMetricFamily(
            "inferd_batch_close",
            "Why each batch left the queue: full, preferred_size, max_delay, "
            "shape_mismatch, queue_empty.",
            labels=(*MV, "reason"),
        )
        for key, count in sorted(items(sink.batch_closes)):
            close.add_metric(list(key), count)
        timeouts = CounterMetricFamily(
            "inferd_execution_timeouts",
            "Executions that passed the model's execution timeout (their requests got 504).",
            labels=MV,
        )
        for (model, version), count in sorted(items(sink.execution_timeouts)):
            timeouts.add_metric([model, version], count)
        bisections = CounterMetricFamily(
            "inferd_batch_bisections",
            "Failed batches executed again in halves to find the requests the model fails on.",
            labels=MV,
        )
        bisect_runs = CounterMetricFamily(
            "inferd_batch_bisection_executions",
            "Executions those bisections took (at most 2N - 2 for a batch of N requests).",
            labels=MV,
        )
        for (model, version), (batches, runs) in sorted(dict(sink.bisections).items()):
            bisections.add_metric([model, version], batches)
            bisect_runs.add_metric([model, version], runs)
        sent = CounterMetricFamily(
            "inferd_stream_responses",
            "Responses decoupled models sent to their clients (error responses included).",
            labels=MV,
        )
        dropped = CounterMetricFamily(
            "inferd_stream_responses_dropped",
            "Responses decoupled models sent after their client had gone, dropped.",
            labels=MV,
        )
        for (model, version), (count, lost) in sorted(dict(sink.stream_responses).items()):
            sent.add_metric([model, version], count)
            dropped.add_metric([model, version], lost)
        yield from (success, failure, inferences, executions, close, timeouts, bisections)
        yield from (bisect_runs, sent, dropped)
        yield from histograms.values()


class _StateCollector(Collector):
    """Gauges read from the registry at scrape time."""

    def __init__(self, registry: ModelRegistry, sink: MetricsSink) -> None:
        self._registry = registry
        self._sink = sink

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("inferd_queue_depth", "Requests waiting for a batch.", labels=MV)
        inflight = GaugeMetricFamily(
            "inferd_inflight_requests", "Requests queued or executing.", labels=MV
        )
        unhealthy = GaugeMetricFamily(
            "inferd_unhealthy_instances",
            "Instances that cannot execute now: stuck past the execution timeout, or with "
            "their worker process down or restarting.",
            labels=MV,
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
        sequences = GaugeMetricFamily(
            "inferd_sequences_active",
            "Sequences holding a batch slot of a sequence model.",
            labels=MV,
        )
        backlog = GaugeMetricFamily(
            "inferd_sequences_backlog",
            "Sequences started but waiting for a free batch slot.",
            labels=MV,
        )
        released = CounterMetricFamily(
            "inferd_sequences_released",
            "Sequences released, by reason: end (their END request executed), idle "
            "(max_sequence_idle_microseconds without a request), unload.",
            labels=(*MV, "reason"),
        )
        live: set[tuple[str, str]] = set()
        for name, model in sorted(items(self._registry.models)):
            load_failures.add_metric([name], model.load_failures)
            if model.circuit.policy.enabled:
                circuit_open.add_metric([name], 1.0 if model.circuit.is_open else 0.0)
                circuit_opens.add_metric([name], model.circuit.opens)
            for v, w in sorted(items(model.router.weights)):
                weight.add_metric([name, v], w)
            for v, count in sorted(items(model.router.rollbacks)):
                rollbacks.add_metric([name, v], count)
            for v, mv in sorted(items(model.versions)):
                labels = [name, v]
                live.add((name, v))
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
                    unhealthy.add_metric(labels, mv.batcher.unhealthy_instances())
                if isinstance(mv.batcher, SequenceBatcher):
                    sequences.add_metric(labels, mv.batcher.active_sequences())
                    backlog.add_metric(labels, mv.batcher.backlog())
                    for reason, count in sorted(mv.batcher.released().items()):
                        released.add_metric([*labels, reason], count)
                if mv.is_ready:
                    raw = parameter(mv.config, "health_p99_baseline_ms", "")
                    baseline = float(raw) / 1000 if raw else None
                    health.add_metric(labels, self._sink.health_score(name, v, baseline))
        self._sink.keep_windows(live)
        yield from (depth, inflight, unhealthy, state, load, warmup, info, health)
        yield from (sequences, backlog, released)
        yield from (weight, rollbacks, load_failures, circuit_open, circuit_opens)
        yield CounterMetricFamily(
            "inferd_process_memory_returned_bytes",
            "Resident memory given back to the OS after model versions were released.",
            value=self._registry.memory.returned_bytes,
        )
