"""The inferd_drift_* metric families, read from each version's drift monitor at scrape
time (docs/metrics.md, docs/monitoring.md). The monitors replace their results whole, so a
scrape reads a consistent window per tensor without a lock."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.repository.registry import ModelRegistry
from inferd.telemetry.snapshots import items

LABELS = ("model", "version", "tensor", "test")


class DriftCollector(Collector):
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        score = GaugeMetricFamily(
            "inferd_drift_score",
            "Drift of a tensor in the latest window, its worst column: the KS statistic "
            "(test=ks), the population stability index (psi), Cramér's V of the predicted "
            "classes (chi2).",
            labels=LABELS,
        )
        p_value = GaugeMetricFamily(
            "inferd_drift_p_value",
            "p-value of the latest window's test (ks: the worst column's, times the columns "
            "tested; chi2): small means the live rows are unlikely to come from the reference.",
            labels=LABELS,
        )
        alerting = GaugeMetricFamily(
            "inferd_drift_alerting",
            "1 while the latest window is past the model's drift threshold "
            "(drift_p_value_threshold, drift_psi_threshold).",
            labels=LABELS,
        )
        windows = CounterMetricFamily(
            "inferd_drift_windows",
            "Windows of live rows tested against the reference.",
            labels=("model", "version", "tensor"),
        )
        sampled = CounterMetricFamily(
            "inferd_drift_samples",
            "Executed batches handed to the drift monitor.",
            labels=("model", "version"),
        )
        dropped = CounterMetricFamily(
            "inferd_drift_samples_dropped",
            "Executed batches the drift monitor dropped: it was resting within its CPU "
            "budget, or busy with the batches queued before. Requests are never slowed "
            "instead.",
            labels=("model", "version"),
        )
        cpu = CounterMetricFamily(
            "inferd_drift_cpu_seconds",
            "CPU time the drift monitor's thread spent on samples and tests (at most "
            "drift_cpu_budget of one core).",
            labels=("model", "version"),
        )
        for name, model in sorted(items(self._registry.models)):
            for v, mv in sorted(items(model.versions)):
                monitor = mv.drift
                if monitor is None:
                    continue
                sampled.add_metric([name, v], monitor.sampled)
                dropped.add_metric([name, v], monitor.dropped)
                cpu.add_metric([name, v], monitor.cpu_s)
                for tensor, drift in sorted(monitor.latest.items()):
                    windows.add_metric([name, v, tensor], drift.windows)
                    for test, result in sorted(drift.tests.items()):
                        labels = [name, v, tensor, test]
                        score.add_metric(labels, result.score)
                        alerting.add_metric(labels, 1.0 if result.alerting else 0.0)
                        if result.p_value is not None:
                            p_value.add_metric(labels, result.p_value)
        yield from (score, p_value, alerting, windows, sampled, dropped, cpu)
