"""The capture's and feedback's Prometheus families, built at scrape time from their counts
(docs/metrics.md and docs/capture.md define them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd.telemetry.snapshots import items

if TYPE_CHECKING:
    from inferd.dataplane.capture import Capture

MV = ("model", "version")


class CaptureCollector(Collector):
    def __init__(self, capture: Capture) -> None:
        self._capture = capture

    def collect(self) -> Iterator[Metric]:
        capture = self._capture
        held = capture.registry.holds  # what a late record brought back stays unseen
        captured = CounterMetricFamily(
            "inferd_captured", "Requests sampled for capture (capture_sample_rate).", labels=MV
        )
        for labels, count in sorted(items(capture.captured)):
            if held(*labels):
                captured.add_metric(labels, count)
        yield captured
        dropped = CounterMetricFamily(
            "inferd_capture_dropped",
            "Sampled requests not stored, by reason: queue_full, write_error, too_large, "
            "redis_error, internal.",
            labels=("model", "reason"),
        )
        for labels, count in sorted(capture.drops.snapshot().items()):
            dropped.add_metric(labels, count)
        yield dropped
        if capture.writer is not None:
            removed = CounterMetricFamily(
                "inferd_capture_shards_removed",
                "Capture shards removed, oldest first, to keep --capture-max-mib.",
            )
            removed.add_metric([], capture.writer.shards_removed)
            yield removed
        feedback = capture.feedback
        outcomes = CounterMetricFamily(
            "inferd_feedback",
            "Feedback calls, by outcome: joined, unknown_id, expired, duplicate, invalid.",
            labels=(*MV, "outcome"),
        )
        for outcome_labels, count in sorted(items(feedback.counts)):
            if held(outcome_labels[0], outcome_labels[1]):
                outcomes.add_metric(outcome_labels, count)
        yield outcomes
        accuracy = GaugeMetricFamily(
            "inferd_online_accuracy",
            "Share of the last accuracy_window labelled rows the version predicted right.",
            labels=MV,
        )
        labelled = GaugeMetricFamily(
            "inferd_online_accuracy_rows",
            "Labelled rows the online accuracy is over (at most accuracy_window).",
            labels=MV,
        )
        for labels, window in sorted(items(feedback.windows)):
            if not held(*labels):
                continue
            right, rows = window.counts
            if rows:
                accuracy.add_metric(labels, right / rows)
                labelled.add_metric(labels, rows)
        yield accuracy
        yield labelled
