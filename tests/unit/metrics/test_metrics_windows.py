"""The metrics sink forgets the series and health windows of versions that are gone, and a
scrape exports only what the registry still holds."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.core import Metric

from inferd.events import BatchRecord, CallContext, RequestRecord, ResponseTimes
from inferd.metrics.prometheus import MetricsSink
from inferd.reliability.health_score import IDLE_SCORE
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.statistics import StatisticsSink


def _record(sink: MetricsSink, model: str, version: str, failure: str | None = None) -> None:
    ctx = CallContext("http")
    stream = [ResponseTimes("success", 1000, 10)]
    record = RequestRecord(model, version, ctx, 1_000_000, failure=failure, responses=stream)
    sink.on_request(record)


def _batch(sink: MetricsSink, version: str, failed: bool = False) -> None:
    sink.on_batch(
        BatchRecord("m", version, 2, 2, "max_delay", 1, 1, 1, failed, failed, int(failed) * 2)
    )


def _keys(sink: MetricsSink) -> set[tuple[str, ...]]:
    kept = (
        sink.series, sink.failures, sink.stream_responses, sink.batch_closes,
        sink.execution_timeouts, sink.bisections, sink._windows,
    )  # fmt: skip
    return {key for shared in kept for key in shared}


def test_forget_drops_every_series_of_a_gone_version(tmp_path: Path) -> None:
    sink = MetricsSink(ModelRegistry(tmp_path), StatisticsSink(), host_metrics=False)
    try:
        for version in ("1", "2"):
            for _ in range(5):
                _record(sink, "m", version, failure="model_error")
            _record(sink, "m", version)
            _batch(sink, version)
            _batch(sink, version, failed=True)
        _record(sink, "m", "", failure="unavailable")  # no version took it: the model's
        assert sink.health_score("m", "1", None) < IDLE_SCORE
        sink.forget(lambda model, version: version == "1")  # version 1 was unloaded
        assert {key[:2] for key in _keys(sink)} == {("m", "2"), ("m", "")}
        assert sink.health_score("m", "1", None) == IDLE_SCORE  # its samples are gone
        assert sink.health_score("m", "2", None) < IDLE_SCORE
        sink.forget(lambda model, version: model == "m")  # the whole model unloaded
        assert _keys(sink) == set()
    finally:
        sink.close()


def _series(families: list[Metric], name: str) -> set[tuple[str, str]]:
    return {
        (s.labels["model"], s.labels["version"])
        for f in families
        for s in f.samples
        if s.name == name
    }


def test_a_scrape_exports_only_what_the_registry_holds(tmp_path: Path) -> None:
    sink = MetricsSink(ModelRegistry(tmp_path), StatisticsSink(), host_metrics=False)
    try:
        _record(sink, "m", "1", failure="model_error")  # the registry holds no model "m"
        _record(sink, "", "", failure="not_found")  # a name the repository lacks
        families = list(sink.prometheus.collect())
        assert _series(families, "inferd_request_failure_total") == {("", "")}
    finally:
        sink.close()
