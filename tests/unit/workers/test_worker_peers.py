"""Merging what the workers of one server report: Triton statistics and metric families."""

from __future__ import annotations

import asyncio
import functools
import math
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inferd.dataplane.plane import DataPlane
from inferd.events import BatchRecord, ResponseTimes, Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.statistics import StatisticsSink, VersionStats
from inferd.workers.peers import (
    PeerServer,
    WorkerSlot,
    ask,
    families_to_json,
    merge_families,
    merge_model_stats,
)
from inferd.workers.worker_statistics import WorkersStatistics


def _stats(success: int, batches: dict[int, int], last: int) -> list[dict[str, object]]:
    s = VersionStats()
    for _ in range(success):
        s.success.add(10)
        s.queue.add(3)
    s.inference_count = success
    s.execution_count = sum(batches.values())
    for size, count in batches.items():
        for _ in range(count):
            s.batches[size].compute_infer.add(100)
    s.last_inference_ms = last
    return [StatisticsSink._render("m", "1", s)]


def test_statistics_of_workers_add_up() -> None:
    merged = merge_model_stats([_stats(5, {1: 1, 4: 1}, 100), _stats(3, {4: 2, 8: 1}, 250)])
    assert len(merged) == 1
    m = merged[0]
    assert (m["inference_count"], m["execution_count"], m["last_inference"]) == (8, 5, 250)
    assert m["inference_stats"]["success"] == {"count": 8, "ns": 80}
    assert m["inference_stats"]["queue"] == {"count": 8, "ns": 24}
    sizes = {b["batch_size"]: b["compute_infer"] for b in m["batch_stats"]}
    assert sizes == {
        1: {"count": 1, "ns": 100},
        4: {"count": 3, "ns": 300},
        8: {"count": 1, "ns": 100},
    }
    assert [b["batch_size"] for b in m["batch_stats"]] == [1, 4, 8]


def test_cache_statistics_of_workers_add_up() -> None:
    def answer(hits: int, misses: int, waited: int) -> list[dict[str, object]]:
        s = VersionStats()
        for _ in range(hits):
            s.cache_hit.add(5)
        for _ in range(misses):
            s.cache_miss.add(7)
        for _ in range(waited):
            s.coalesced.add(11)
        entry = StatisticsSink._render("m", "1", s)
        entry["coalesced"] = s.coalesced.to_dict()  # inferd's field (dataplane/statistics_api.py)
        return [entry]

    merged = merge_model_stats([answer(2, 1, 1), answer(3, 4, 2)])[0]
    stats = merged["inference_stats"]
    assert stats["cache_hit"] == {"count": 5, "ns": 25}
    assert stats["cache_miss"] == {"count": 5, "ns": 35}
    assert merged["coalesced"] == {"count": 3, "ns": 33}


def test_padding_statistics_of_workers_add_up() -> None:
    def answer(batches: int, real: int, padded: int) -> list[dict[str, object]]:
        entry = StatisticsSink._render("m", "1", VersionStats())
        # inferd's field for a model with pad_inputs (dataplane/statistics_api.py)
        entry["padding"] = {"batches": batches, "real_elements": real, "padded_elements": padded}
        return [entry]

    merged = merge_model_stats([answer(2, 10, 12), answer(3, 20, 30)])[0]
    assert merged["padding"] == {"batches": 5, "real_elements": 30, "padded_elements": 42}


def test_response_statistics_of_workers_add_up_per_position() -> None:
    def answer(positions: int) -> list[dict[str, object]]:
        s = VersionStats()
        for position in range(positions):
            s.responses[position].add(ResponseTimes("success", 10, 1))
        return [StatisticsSink._render("m", "1", s)]

    merged = merge_model_stats([answer(1), answer(3), answer(2)])
    stats = merged[0]["response_stats"]
    assert list(stats) == ["0", "1", "2"]
    assert [stats[k]["success"] for k in stats] == [
        {"count": 3, "ns": 33},
        {"count": 2, "ns": 22},
        {"count": 1, "ns": 11},
    ]
    assert stats["0"]["compute_infer"] == {"count": 3, "ns": 30}


def test_merging_leaves_the_answers_untouched() -> None:
    first = _stats(5, {1: 1}, 100)
    merge_model_stats([first, _stats(3, {1: 1}, 100)])
    assert first[0]["inference_count"] == 5
    assert first[0]["batch_stats"][0]["compute_infer"] == {"count": 1, "ns": 100}  # type: ignore[index]


def test_models_only_one_worker_knows_are_kept() -> None:
    other = _stats(2, {}, 1)
    other[0]["name"] = "n"
    merged = merge_model_stats([_stats(1, {}, 1), other])
    assert sorted(m["name"] for m in merged) == ["m", "n"]


def _registry(requests: float, queued: float, latency: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("inferd_requests", "r", ["model"], registry=registry).labels("a").inc(requests)
    Gauge("inferd_queued", "q", registry=registry).set(queued)
    Histogram("inferd_latency_seconds", "l", buckets=(0.1, 1.0), registry=registry).observe(latency)
    return registry


def test_metric_families_of_workers_get_a_worker_label_and_stay_valid() -> None:
    per_worker = {
        0: families_to_json(_registry(3, math.inf, 0.05).collect()),
        1: families_to_json(_registry(4, math.nan, 0.5).collect()),
    }
    per_worker = {k: orjson.loads(orjson.dumps(v)) for k, v in per_worker.items()}  # travel
    merged = CollectorRegistry()

    class Merged:
        def collect(self):  # type: ignore[no-untyped-def]
            return merge_families(per_worker)

    merged.register(Merged())  # type: ignore[arg-type]
    text = generate_latest(merged).decode()
    assert text.count("# TYPE inferd_requests_total counter") == 1
    assert 'inferd_requests_total{model="a",worker="0"} 3.0' in text
    assert 'inferd_requests_total{model="a",worker="1"} 4.0' in text
    assert 'inferd_queued{worker="0"} +Inf' in text
    assert 'inferd_queued{worker="1"} NaN' in text
    assert 'inferd_latency_seconds_bucket{le="+Inf",worker="0"} 1.0' in text
    assert 'inferd_latency_seconds_bucket{le="0.1",worker="0"} 1.0' in text
    assert 'inferd_latency_seconds_bucket{le="0.1",worker="1"} 0.0' in text


def test_a_sibling_answer_past_the_stream_line_limit_arrives_whole(tmp_path: Path) -> None:
    # Many models' statistics make one answer line longer than asyncio's 64 KiB line limit.
    slot = WorkerSlot(0, 2, tmp_path)
    entries = [_stats(1, {1: 1}, 1)[0] | {"name": f"model_{i:04d}"} for i in range(400)]
    server = PeerServer(slot, lambda name, version: entries, None)

    async def scenario() -> dict[str, object] | None:
        await server.start()
        try:
            return await ask(slot.socket_path(0), {"op": "stats", "model": "", "version": ""})
        finally:
            await server.close()

    answer = asyncio.run(scenario())
    assert answer is not None
    assert len(orjson.dumps(answer)) > 128 * 1024
    assert [e["name"] for e in answer["stats"]] == [f"model_{i:04d}" for i in range(400)]  # type: ignore[attr-defined, index]


def test_a_sibling_that_is_not_there_is_no_answer(tmp_path: Path) -> None:
    slot = WorkerSlot(0, 2, tmp_path)
    assert asyncio.run(ask(slot.socket_path(1), {"op": "stats"})) is None


def test_server_statistics_keep_a_silent_siblings_last_answer(tmp_path: Path) -> None:
    # Clients read deltas of these totals: a sibling that cannot answer for a moment must
    # not make them drop.
    slot = WorkerSlot(0, 2, tmp_path)
    statistics = functools.partial(WorkersStatistics, slot=slot)
    dataplane = DataPlane(ModelRegistry(tmp_path / "repo"), Telemetry(), statistics=statistics)
    sibling = PeerServer(WorkerSlot(1, 2, tmp_path), lambda name, version: _stats(7, {}, 5), None)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        await sibling.start()
        answered = await dataplane.statistics.server_statistics()
        await sibling.close()
        silent = await dataplane.statistics.server_statistics()
        return answered, silent

    answered, silent = asyncio.run(scenario())
    assert answered["model_stats"][0]["inference_count"] == 7
    assert silent == answered


def test_an_execution_is_never_seen_without_its_rows() -> None:
    # A statistics call can land between a batch's end and its requests' completion (bench
    # windows do): the rows must already be there, or rows per execution reads below 1.
    sink = StatisticsSink()
    sink.on_batch(BatchRecord("m", "1", 3, 2, "max_delay", 1, 2, 3, False))
    sink.on_batch(BatchRecord("m", "1", 5, 5, "max_batch", 1, 2, 3, True))  # failed: not counted
    (stats,) = sink.model_stats("m", ["1"])
    assert (stats["execution_count"], stats["inference_count"]) == (1, 3)


def test_degradation_of_workers_merges_as_the_worst_tier_and_summed_counts() -> None:
    def answer(tier: int, p99_ms: float, changes: int, fallback: int) -> list[dict[str, Any]]:
        entry: dict[str, Any] = StatisticsSink._render("m", "1", VersionStats())
        requests = {"1": {"fallback": fallback}} if fallback else {}
        entry["degradation"] = {
            "tier": tier, "p99_ms": p99_ms, "tier_changes": changes, "requests": requests,
            "dwell_s": 10.0 * (changes or 1), "trial": tier == 0 and changes > 1,
        }  # fmt: skip
        return [entry]

    merged = merge_model_stats(
        [answer(1, 420.0, 1, 7), answer(0, 90.0, 2, 0), answer(1, 300, 1, 5)]
    )
    assert merged[0]["degradation"] == {
        "tier": 1,
        "p99_ms": 420.0,
        "tier_changes": 4,
        "requests": {"1": {"fallback": 12}},
        "dwell_s": 20.0,  # the longest
        "trial": True,  # any worker's
    }


def test_forgetting_unloaded_versions_drops_the_siblings_last_answers_about_them(
    tmp_path: Path,
) -> None:
    statistics = WorkersStatistics(lambda n, v: {"model_stats": []}, WorkerSlot(0, 2, tmp_path))
    keys = [(1, "m", "1"), (1, "m", "2"), (1, "m", ""), (1, "", "")]
    statistics._last = {key: [] for key in keys}
    statistics.forget(lambda model, version: version == "1")  # version 1 was unloaded
    assert list(statistics._last) == keys[1:]
    statistics.forget(lambda model, version: model == "m")  # then the whole model
    assert list(statistics._last) == [(1, "", "")]
