"""The trace file's Prometheus family, built at scrape time from its writer's counts
(docs/metrics.md and docs/observability-logs-traces.md define it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from inferd.telemetry.trace_file import TraceFileSink


class TraceFileCollector(Collector):
    def __init__(self, sink: TraceFileSink) -> None:
        self._sink = sink

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "inferd_trace_dropped",
            "Trace records chosen for the trace file but not written, by reason: "
            "queue_full, write_error.",
            labels=("reason",),
        )
        drops = self._sink.writer.drops()
        for reason in ("queue_full", "write_error"):
            dropped.add_metric([reason], drops.get(reason, 0))
        yield dropped
