"""The degradation tiers' Prometheus families (docs/reliability.md#degradation-tiers), read
at scrape time from each model's `Degradation`: nothing on the request path. Only models
whose config declares tiers have series."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.repository.registry import ModelRegistry
from inferd.telemetry.snapshots import items


class DegradationCollector(Collector):
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        tier = GaugeMetricFamily(
            "inferd_degradation_tier",
            "The model's degradation tier now (0: not degraded; docs/reliability.md).",
            labels=("model",),
        )
        p99 = GaugeMetricFamily(
            "inferd_degradation_p99_seconds",
            "The model's p99 latency over its degradation window, as last evaluated.",
            labels=("model",),
        )
        changes = CounterMetricFamily(
            "inferd_degradation_tier_changes",
            "Times the model moved between degradation tiers (either way).",
            labels=("model",),
        )
        degraded = CounterMetricFamily(
            "inferd_degraded_requests",
            "Requests a degradation tier answered or refused, by tier and action: fallback "
            "(its fallback model answered), stale (a cache entry past its TTL), open_circuit "
            "(the fallback, its circuit held open), refused (429 by the tier's queue bound or "
            "503 by its open circuit), fallback_unavailable (served by the model itself: its "
            "fallback was not ready).",
            labels=("model", "tier", "action"),
        )
        for name, model in sorted(items(self._registry.models)):
            state = model.degrade
            if state is None:
                continue
            tier.add_metric([name], state.tier)
            p99.add_metric([name], state.p99_s)
            changes.add_metric([name], state.changes)
            for (number, action), count in sorted(items(state.counts)):
                degraded.add_metric([name, str(number), action], count)
        yield from (tier, p99, changes, degraded)
