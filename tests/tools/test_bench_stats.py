"""inferd bench's arithmetic: percentiles, the stability criterion, the server-side split."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd_tools.bench.stats import (
    Samples,
    is_stable,
    latency_summary,
    percentile,
    server_split,
    stats_totals,
    window,
    within,
)


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 90) == 90
    assert percentile(values, 99) == 99
    assert percentile(values, 99.9) == 100
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    # Ten values: p50 is the 5th, p99 and p99.9 the 10th.
    ten = [float(v) for v in range(10, 110, 10)]
    assert percentile(ten, 50) == 50
    assert percentile(ten, 95) == 100
    assert percentile(ten, 99.9) == 100
    assert percentile([7.0], 50) == percentile([7.0], 99.9) == 7


def test_percentile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=200))
def test_percentiles_are_ordered_members(values: list[float]) -> None:
    summary = latency_summary(values)
    assert summary["min"] <= summary["p50"] <= summary["p90"] <= summary["p95"]
    assert summary["p95"] <= summary["p99"] <= summary["p99.9"] <= summary["max"]
    for key in ("p50", "p90", "p95", "p99", "p99.9"):
        assert summary[key] in values
        # nearest rank: at least q% of the values are at or below it
        q = float(key[1:])
        assert sum(v <= summary[key] for v in values) >= q / 100 * len(values) - 1e-9


def _window(throughput: float, p99_s: float, duration_s: float = 1.0) -> object:
    n = int(throughput * duration_s)
    # n latencies whose p99 is p99_s: all but the top 1% below it.
    latencies = [p99_s / 2] * (n - max(1, n // 100)) + [p99_s] * max(1, n // 100)
    return window(duration_s, Samples(latencies, Counter({"200": n}), n))


def test_stable_needs_three_windows_within_the_percentage() -> None:
    a, b, c = _window(1000, 0.010), _window(1050, 0.0105), _window(980, 0.0098)
    assert not is_stable([a, b], 10)  # type: ignore[list-item]
    assert is_stable([a, b, c], 10)  # type: ignore[list-item]
    assert not is_stable([a, b, c], 2)  # type: ignore[list-item]
    # Throughput steady but p99 jumps: not stable.
    jumpy = _window(1000, 0.030)
    assert not is_stable([a, b, jumpy], 10)  # type: ignore[list-item]
    # Only the last three count.
    assert is_stable([jumpy, a, b, c], 10)  # type: ignore[list-item]
    # Throughput moves: not stable.
    assert not is_stable([a, b, _window(1500, 0.010)], 10)  # type: ignore[list-item]


def test_windows_without_successes_are_never_stable() -> None:
    failed = window(1.0, Samples([], Counter({"500": 100}), 100))
    assert not is_stable([failed, failed, failed], 50)


def test_within_mean() -> None:
    assert within([100, 105, 95], 5)
    assert not within([100, 111, 89], 10)
    assert within([0, 0, 0], 1)
    assert not within([1, math.nan, 1], 10)
    assert not within([], 10)


def test_window_throughput_counts_successes_only() -> None:
    w = window(2.0, Samples([0.001] * 10, Counter({"200": 10, "500": 6}), 16))
    assert w.throughput == 5
    assert w.samples.errors == {"500": 6}
    assert w.samples.completed == 16


def _entry(version: str, success: int, queue_ns: int, infer_ns: int, rows: int, execs: int):
    return {
        "name": "m",
        "version": version,
        "inference_count": rows,
        "execution_count": execs,
        "inference_stats": {
            "success": {"count": success, "ns": success * 500_000},
            "fail": {"count": 0, "ns": 0},
            "queue": {"count": success, "ns": queue_ns},
            "compute_input": {"count": success, "ns": success * 1_000},
            "compute_infer": {"count": success, "ns": infer_ns},
            "compute_output": {"count": success, "ns": success * 2_000},
        },
    }


def test_server_split_is_the_per_request_delta_across_versions() -> None:
    before = stats_totals([_entry("1", 10, 1_000_000, 5_000_000, 10, 10)])
    after = stats_totals(
        [
            _entry("1", 110, 1_000_000 + 100 * 40_000, 5_000_000 + 100 * 60_000, 110, 60),
            _entry("2", 0, 0, 0, 0, 0),
        ]
    )
    split = server_split(before, after)
    assert split["requests"] == 100
    assert split["queue_us"] == pytest.approx(40)
    assert split["compute_infer_us"] == pytest.approx(60)
    assert split["compute_input_us"] == pytest.approx(1)
    assert split["compute_output_us"] == pytest.approx(2)
    assert split["request_us"] == pytest.approx(500)
    assert split["avg_batch"] == pytest.approx(2)


def test_server_split_reads_grpc_json_strings_and_empty_deltas() -> None:
    """gRPC statistics rendered by MessageToDict carry uint64s as strings."""
    entry = {
        "inference_count": "4",
        "execution_count": "2",
        "inference_stats": {"success": {"count": "4", "ns": "4000"}},
    }
    totals = stats_totals([entry])
    assert totals["success_count"] == 4 and totals["inference_count"] == 4
    split = server_split(totals, totals)
    assert split["requests"] == 0 and math.isnan(split["queue_us"])


def test_server_split_gives_a_padding_models_padding_share() -> None:
    def padded(real: int, padded: int) -> dict[str, Any]:
        entry = _entry("1", 0, 0, 0, 0, 0)
        entry["padding"] = {"batches": 1, "real_elements": real, "padded_elements": padded}
        return entry

    split = server_split(stats_totals([padded(100, 100)]), stats_totals([padded(400, 500)]))
    assert split["padding_pct"] == pytest.approx(100 * (400 - 300) / 400)  # 300 real of 400
    assert math.isnan(server_split(stats_totals([]), stats_totals([]))["padding_pct"])
