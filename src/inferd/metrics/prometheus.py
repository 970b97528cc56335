"""Prometheus metrics: every inferd_* metric is defined here, in model_families.py (the
families built at scrape time) and model_series.py (the numbers recorded per version).

`MetricsSink` is the telemetry sink for what happens per request and per batch; at scrape
time its collectors export what it counted and read the registry's state (queue depths,
model states, devices, health), so nothing on the request path pays for gauges.
docs/metrics.md defines each metric. Triton's names live in triton_names.py, the host's
CPU and GPUs in host_families.py, the endpoint in metrics_endpoint.py.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from inferd.events import BatchRecord, Gone, RequestRecord, forget_keys
from inferd.metrics.drift_families import DriftCollector
from inferd.metrics.host_families import GpuCollector, register_host_metrics
from inferd.metrics.load_families import LoadCollector
from inferd.metrics.model_families import CountsCollector, StateCollector
from inferd.metrics.model_series import GC_BUCKETS_S, Series
from inferd.metrics.triton_names import TritonCollector
from inferd.reliability.health_score import IDLE_SCORE, HealthWindow
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.statistics import StatisticsSink

log = logging.getLogger("inferd.metrics")

# The *_created series double every counter's output for a feature few queries use.
disable_created_metrics()  # type: ignore[no-untyped-call]


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
        self._registry = registry
        r = self.prometheus
        self.series: dict[tuple[str, str], Series] = {}
        self.failures: dict[tuple[str, str, str], int] = {}
        # Decoupled models: (responses sent to clients, responses dropped) per version.
        self.stream_responses: dict[tuple[str, str], list[int]] = {}
        self.batch_closes: dict[tuple[str, str, str], int] = {}
        # Models with pad_inputs: [real, padded] elements of their padded inputs.
        self.padding: dict[tuple[str, str], list[int]] = {}
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
        r.register(CountsCollector(self))
        r.register(StateCollector(registry, self))
        r.register(LoadCollector(registry))
        r.register(DriftCollector(registry))
        if triton_names:
            r.register(TritonCollector(registry, statistics, self.failures))
            if host_metrics:
                self._gpus = register_host_metrics(r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total
        GCCollector(registry=r)
        PlatformCollector(registry=r)

    def _series(self, model: str, version: str) -> Series:
        key = (model, version)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series()
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
        if record.padded_elements:
            elements = self.padding.setdefault((record.model, record.version), [0, 0])
            elements[0] += record.real_elements
            elements[1] += record.padded_elements
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

    def forget(self, gone: Gone) -> None:
        """Unloaded versions' series and health windows go (on the loop, as an unload
        completes): otherwise every version a model ever had would stay on /metrics."""
        for shared in (
            self.series, self.failures, self.stream_responses, self.batch_closes,
            self.execution_timeouts, self.bisections, self.padding, self._windows,
        ):  # fmt: skip
            forget_keys(shared, gone)

    def holds(self, model: str, version: str) -> bool:
        """Whether (model, version)'s series are exported: the registry still holds it (a
        record that ended after its version's unload is kept until the next one, unseen)."""
        return self._registry.holds(model, version)

    def health_score(
        self, model: str, version: str, baseline_s: float | None, now: float | None = None
    ) -> float:
        """The version's health score over the last minute (docs/metrics.md); from a scrape
        thread, so it reads the window without creating one (only the loop adds windows).
        `now`: as HealthWindow.score's."""
        window = self._windows.get((model, version))
        return IDLE_SCORE if window is None else window.score(baseline_s, now)

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
