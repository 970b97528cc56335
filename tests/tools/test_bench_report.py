"""inferd bench's reports: the CSV's `stable` column and the plot's point labels, drawn by
real matplotlib."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from inferd_tools.bench import report
from inferd_tools.bench.runner import BenchConfig, BenchResult, LevelResult


def _level(
    value: float, throughput: float, p50: float, p99: float, stable: bool | None
) -> LevelResult:
    latency = dict.fromkeys(report.LATENCY_KEYS, p50)
    latency.update({"p99": p99, "p99.9": p99, "max": p99})
    return LevelResult(
        mode="concurrency",
        value=value,
        windows=1 if stable is None else 3,
        stable=stable,
        duration_s=1.0,
        throughput=throughput,
        sent=int(throughput),
        completed=int(throughput),
        successes=int(throughput),
        errors={},
        latency_ms=latency,
        server=None,
    )


def _result(levels: list[LevelResult]) -> BenchResult:
    config = BenchConfig(model="mlp", concurrency=[int(level.value) for level in levels])
    return BenchResult(config, levels, cores=2, processes=1, inputs=[], server_stats=False)


def test_csv_stable_is_empty_where_no_stability_check_ran(tmp_path: Path) -> None:
    result = _result(
        [_level(1, 100, 1, 2, None), _level(2, 150, 1, 2, True), _level(4, 160, 1, 9, False)]
    )
    path = tmp_path / "out.csv"
    report.write_csv(result, path)
    with path.open() as f:
        assert [row["stable"] for row in csv.DictReader(f)] == ["", "True", "False"]
    assert [level["stable"] for level in report.to_json(result)["levels"]] == [None, True, False]
    # Only a level whose check failed is marked in the table.
    rows = report.table(result).splitlines()[1:4]
    assert ["(unstable)" in row for row in rows] == [False, False, True]


# Extreme shapes: labels at every corner of the data, one point only, and a level without
# successes (NaN latencies: no point, no label).
CASES = {
    "spread": [
        _level(1, 90, 0.4, 0.9, None),
        _level(8, 3000, 2.0, 5.0, None),
        _level(64, 6000, 9.0, 40.0, None),
    ],
    "one level": [_level(1, 1200, 0.8, 1.1, None)],
    "flat": [_level(1, 500, 1.0, 1.0, None), _level(2, 500, 1.0, 1.0, None)],
    "failed level": [_level(1, 100, 1.0, 2.0, None), _level(2, 0, math.nan, math.nan, None)],
}


@pytest.mark.parametrize("levels", list(CASES.values()), ids=list(CASES))
def test_plot_labels_every_point_of_both_lines_inside_the_axes(levels: list[LevelResult]) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = report.plot_figure(_result(levels))
    try:
        (ax,) = fig.axes
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        frame = ax.get_window_extent(renderer)
        labels = list(ax.texts)
        points = {
            (float(x), float(y))  # type: ignore[arg-type]
            for line in ax.get_lines()
            for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)  # type: ignore[arg-type, call-overload]
            if not math.isnan(y)  # type: ignore[arg-type]
        }
        measured = [lv for lv in levels if not math.isnan(lv.latency_ms["p50"])]
        assert len(labels) == 2 * len(measured)  # on the p50 line and on the p99 line
        expected = {
            (lv.throughput, lv.latency_ms[key]) for lv in measured for key in ("p50", "p99")
        }
        assert {tuple(map(float, t.xy)) for t in labels} == expected == points  # type: ignore[attr-defined]
        assert sorted(t.get_text() for t in labels) == sorted(
            f"c={lv.value:g}" for lv in measured for _ in "ab"
        )
        for label in labels:
            box = label.get_window_extent(renderer)
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (label.get_text(), box, frame)
            assert frame.y0 <= box.y0 and box.y1 <= frame.y1, (label.get_text(), box, frame)
    finally:
        plt.close(fig)
