"""The inferd_* metric families, built at scrape time: what the metrics sink counted
(`CountsCollector`), and gauges read from the registry's state (`StateCollector`), so
nothing on the request path pays for gauges. docs/metrics.md defines each metric.

Scrapes run on the metrics server's threads while the event loop records, so collectors
read the dicts it adds keys to through snapshots.items() and the health windows through
their lock (reliability/health_score.py), never by iterating a live container (issue #13).
The loop drops an unloaded version's keys when its unload completes (`MetricsSink.forget`);
a scrape exports only what the registry still holds (`holds`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from inferd.config.model_config import backend_name
from inferd.metrics.model_series import HISTOGRAMS, Series
from inferd.repository.model_state import State
from inferd.repository.registry import ModelRegistry
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.sequence.sequence_batcher import SequenceBatcher
from inferd.telemetry.snapshots import items

MV = ("model", "version")


class RecordedMetrics(Protocol):
    """What the collectors read of the sink that records (metrics.MetricsSink)."""

    series: dict[tuple[str, str], Series]
    failures: dict[tuple[str, str, str], int]
    stream_responses: dict[tuple[str, str], list[int]]
    batch_closes: dict[tuple[str, str, str], int]
    execution_timeouts: dict[tuple[str, str], int]
    bisections: dict[tuple[str, str], list[int]]
    padding: dict[tuple[str, str], list[int]]

    def health_score(self, model: str, version: str, baseline_s: float | None) -> float: ...

    def holds(self, model: str, version: str) -> bool: ...


class CountsCollector(Collector):
    """Exports what MetricsSink counted, as Prometheus counters and native histograms."""

    def __init__(self, sink: RecordedMetrics) -> None:
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
        held = sink.holds
        for (model, version), series in sorted(items(sink.series)):
            if not held(model, version):
                continue
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
            if held(key[0], key[1]):
                failure.add_metric(list(key), count)
        close = CounterMetricFamily(
            "inferd_batch_close",
            "Why each batch left the queue: full, preferred_size, max_delay, "
            "shape_mismatch, length, queue_empty.",
            labels=(*MV, "reason"),
        )
        for key, count in sorted(items(sink.batch_closes)):
            if held(key[0], key[1]):
                close.add_metric(list(key), count)
        timeouts = CounterMetricFamily(
            "inferd_execution_timeouts",
            "Executions that passed the model's execution timeout (their requests got 504).",
            labels=MV,
        )
        for (model, version), count in sorted(items(sink.execution_timeouts)):
            if held(model, version):
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
        for (model, version), (batches, runs) in sorted(items(sink.bisections)):
            if not held(model, version):
                continue
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
        for (model, version), (count, lost) in sorted(items(sink.stream_responses)):
            if not held(model, version):
                continue
            sent.add_metric([model, version], count)
            dropped.add_metric([model, version], lost)
        real = CounterMetricFamily(
            "inferd_batch_real_elements",
            "Models with pad_inputs: elements of the padded inputs that requests sent.",
            labels=MV,
        )
        padded = CounterMetricFamily(
            "inferd_batch_padded_elements",
            "Models with pad_inputs: elements of those inputs the model received, padded to "
            "each batch's longest (padded / real is the padding waste).",
            labels=MV,
        )
        for (model, version), (sent_elements, received) in sorted(items(sink.padding)):
            if held(model, version):
                real.add_metric([model, version], sent_elements)
                padded.add_metric([model, version], received)
        yield from (success, failure, inferences, executions, close, timeouts, bisections)
        yield from (bisect_runs, sent, dropped, real, padded)
        yield from histograms.values()


class StateCollector(Collector):
    """Gauges read from the registry at scrape time."""

    def __init__(self, registry: ModelRegistry, sink: RecordedMetrics) -> None:
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
        probes = CounterMetricFamily(
            "inferd_readiness_probes",
            "Probes readiness ran after a run of failed executions, by result: passed (the "
            "model served an input it took before: the failures were their inputs') or "
            "failed (the model is not ready until an execution succeeds).",
            labels=(*MV, "result"),
        )
        for name, model in sorted(items(self._registry.models)):
            if not self._registry.holds(name, ""):
                continue  # unloaded on request: its series went with it
            load_failures.add_metric([name], model.load_failures)
            if model.circuit.policy.enabled or model.degrade is not None:  # a tier may hold it
                circuit_open.add_metric([name], 1.0 if model.circuit.is_open else 0.0)
                circuit_opens.add_metric([name], model.circuit.opens)
            for v, w in sorted(items(model.router.weights)):
                weight.add_metric([name, v], w)
            for v, count in sorted(items(model.router.rollbacks)):
                rollbacks.add_metric([name, v], count)
            for v, mv in sorted(items(model.versions)):
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
                    unhealthy.add_metric(labels, mv.batcher.unhealthy_instances())
                if isinstance(mv.batcher, DynamicBatcher):
                    readiness = mv.batcher.readiness
                    probes.add_metric([*labels, "passed"], readiness.passed)
                    probes.add_metric([*labels, "failed"], readiness.failed)
                if isinstance(mv.batcher, SequenceBatcher):
                    sequences.add_metric(labels, mv.batcher.active_sequences())
                    backlog.add_metric(labels, mv.batcher.backlog())
                    for reason, count in sorted(mv.batcher.released().items()):
                        released.add_metric([*labels, reason], count)
                if mv.is_ready:
                    baseline = mv.spec.health_p99_baseline_s
                    health.add_metric(labels, self._sink.health_score(name, v, baseline))
        yield from (depth, inflight, unhealthy, state, load, warmup, info, health)
        yield from (sequences, backlog, released, probes)
        yield from (weight, rollbacks, load_failures, circuit_open, circuit_opens)
        yield CounterMetricFamily(
            "inferd_process_memory_returned_bytes",
            "Resident memory given back to the OS after model versions were released.",
            value=self._registry.memory.returned_bytes,
        )
