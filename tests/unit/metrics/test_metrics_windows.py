"""The metrics sink forgets the health windows of versions that are gone."""

from __future__ import annotations

from pathlib import Path

from inferd.events import CallContext, RequestRecord
from inferd.metrics.prometheus import MetricsSink
from inferd.reliability.health_score import IDLE_SCORE
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.statistics import StatisticsSink


def _fail(sink: MetricsSink, version: str) -> None:
    ctx = CallContext("http")
    sink.on_request(RequestRecord("m", version, ctx, 1_000_000, failure="model_error"))


def test_windows_of_versions_that_are_gone_are_dropped(tmp_path: Path) -> None:
    sink = MetricsSink(ModelRegistry(tmp_path), StatisticsSink(), host_metrics=False)
    try:
        for version in ("1", "2"):
            for _ in range(5):
                _fail(sink, version)
        assert sink.health_score("m", "1", None) < IDLE_SCORE
        sink.keep_windows({("m", "2")})  # version 1 was unloaded
        assert sink.health_score("m", "1", None) == IDLE_SCORE  # its samples are gone
        assert sink.health_score("m", "2", None) < IDLE_SCORE
    finally:
        sink.close()


def test_a_scrape_drops_the_windows_of_unknown_versions(tmp_path: Path) -> None:
    sink = MetricsSink(ModelRegistry(tmp_path), StatisticsSink(), host_metrics=False)
    try:
        _fail(sink, "1")
        assert sink.health_score("m", "1", None) < IDLE_SCORE
        list(sink.prometheus.collect())  # a scrape: the registry holds no model "m"
        assert sink.health_score("m", "1", None) == IDLE_SCORE
    finally:
        sink.close()
