"""The autoscaling signal, per model, read at scrape time: `inferd_instance_utilization`
and `inferd_capacity_ratio` (docs/metrics.md, and the HPA in deploy/kubernetes/).

A model's versions (a canary beside the default) share its replicas, so their windows are
summed: the model is the unit a replica serves, and the unit an autoscaler sizes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.repository.registry import ModelRegistry
from inferd.scheduling.load_signal import IDLE, WINDOW_S
from inferd.telemetry.snapshots import items


class LoadCollector(Collector):
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        utilization = GaugeMetricFamily(
            "inferd_instance_utilization",
            f"0..1: time the model's instances spent executing over the last {WINDOW_S} s, "
            "over their time.",
            labels=("model",),
        )
        capacity = GaugeMetricFamily(
            "inferd_capacity_ratio",
            f"Demand over capacity in the last {WINDOW_S} s: the execution time the rows "
            "that arrived need, at the current cost per row, over the instances' time "
            "(above 1: more arrives than the instances can serve).",
            labels=("model",),
        )
        for name, model in sorted(items(self._registry.models)):
            total, scheduled = IDLE, False
            for _, mv in items(model.versions):
                batcher = mv.batcher
                if batcher is not None:
                    total, scheduled = total + batcher.load_sample(), True
            if scheduled:
                utilization.add_metric([name], total.utilization)
                capacity.add_metric([name], total.capacity_ratio)
        yield from (utilization, capacity)
