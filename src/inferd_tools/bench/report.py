"""Render a benchmark's results: a text table, CSV, JSON and a latency-vs-throughput plot."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.runner import BenchResult, LevelResult
from inferd_tools.bench.stats import PERCENTILES, percentile_key

if TYPE_CHECKING:  # matplotlib is optional (the 'bench' extra) and imported only to plot
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation

LATENCY_KEYS = [percentile_key(q) for q in PERCENTILES] + ["avg", "min", "max"]
SERVER_KEYS = [
    "request_us",
    "queue_us",
    "compute_input_us",
    "compute_infer_us",
    "compute_output_us",
    "avg_batch",
]
CSV_FIELDS = [
    "mode",
    "value",
    "throughput",
    "infer_per_s",
    *(f"{k}_ms" for k in LATENCY_KEYS),
    "sent",
    "completed",
    "successes",
    "error_count",
    "errors",
    "windows",
    "stable",
    "duration_s",
    *(f"server_{k}" for k in SERVER_KEYS),
]


def _fmt_ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def _fmt_us(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.0f}"


def header(result: BenchResult) -> str:
    c = result.config
    where = (
        "in the main process"
        if result.processes == 1
        else f"in {result.processes} worker processes"
    )
    loop = "open loop" + (", Poisson" if c.poisson else ", constant") if c.request_rates else ""
    return (
        f"inferd bench: model {c.model!r} at {c.address} over {c.protocol} ({result_encoding(c)})"
        f"{', ' + loop if loop else ''}; load generator {where} on a {result.cores}-core "
        f"machine; inputs "
        + ", ".join(f"{i['name']} {i['datatype']} {i['shape']}" for i in result.inputs)
        + (
            f" (the first of {result.requests} requests, sent in turn)"
            if result.requests > 1
            else ""
        )
    )


def result_encoding(config: Any) -> str:
    return str(config.encoding) + " tensors"


def table(result: BenchResult) -> str:
    first = "rate/s" if result.config.request_rates else "concurrency"
    rows = [
        [
            first,
            "req/s",
            *(f"{k} ms" for k in LATENCY_KEYS[:5]),
            "avg ms",
            "errors",
            "windows",
        ]
    ]
    for level in result.levels:
        errors = ", ".join(f"{k}: {v}" for k, v in level.errors.items()) or "0"
        rows.append(
            [
                f"{level.value:g}",
                f"{level.throughput:,.1f}",
                *(_fmt_ms(level.latency_ms[k]) for k in LATENCY_KEYS[:5]),
                _fmt_ms(level.latency_ms["avg"]),
                errors,
                f"{level.windows}{' (unstable)' if level.stable is False else ''}",
            ]
        )
    lines = [_align(rows)]
    if any(level.server for level in result.levels):
        srows = [
            [first, "server req", "request us", "queue us", "input us", "infer us", "output us"]
            + ["avg batch"]
        ]
        for level in result.levels:
            s = level.server
            if not s:
                continue
            srows.append(
                [
                    f"{level.value:g}",
                    f"{s['requests']:,.0f}",
                    *(_fmt_us(s[k]) for k in SERVER_KEYS[:5]),
                    "-" if math.isnan(s["avg_batch"]) else f"{s['avg_batch']:.2f}",
                ]
            )
        lines.append("server side, per request (Triton's statistics, deltas over the windows):")
        lines.append(_align(srows))
    elif not result.server_stats:
        lines.append("server side: the server does not answer the statistics API")
    return "\n".join(lines)


def _align(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def _csv_row(level: LevelResult, batch_size: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "mode": level.mode,
        "value": level.value,
        "throughput": round(level.throughput, 3),
        "infer_per_s": round(level.throughput * batch_size, 3),
        "sent": level.sent,
        "completed": level.completed,
        "successes": level.successes,
        "error_count": sum(level.errors.values()),
        "errors": ";".join(f"{k}={v}" for k, v in level.errors.items()),
        "windows": level.windows,
        # Empty, not True, where no stability check ran (a fixed --duration-s).
        "stable": "" if level.stable is None else level.stable,
        "duration_s": round(level.duration_s, 3),
    }
    for k in LATENCY_KEYS:
        row[f"{k}_ms"] = round(level.latency_ms[k], 4)
    for k in SERVER_KEYS:
        row[f"server_{k}"] = "" if level.server is None else round(level.server[k], 3)
    return row


def write_csv(result: BenchResult, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for level in result.levels:
            writer.writerow(_csv_row(level, result.config.batch_size))


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


def to_json(result: BenchResult) -> dict[str, Any]:
    config = asdict(result.config)
    config["shapes"] = {k: list(v) for k, v in result.config.shapes.items()}
    doc: dict[str, Any] = _nan_to_none(
        {
            "config": config,
            "encoding": result.config.encoding,
            "cores": result.cores,
            "processes": result.processes,
            "inputs": result.inputs,
            "requests": result.requests,
            "server_stats": result.server_stats,
            "interrupted": result.interrupted,
            "levels": [level.as_dict() for level in result.levels],
        }
    )
    return doc


def write_json(result: BenchResult, path: Path) -> None:
    path.write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")


def check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib: pip install 'inferd[bench]' (or pip install matplotlib)"
        ) from None


def write_plot(result: BenchResult, path: Path) -> None:
    """p50 and p99 latency against throughput, one point per level, each labelled."""
    check_plot_available()
    import matplotlib.pyplot as plt

    fig = plot_figure(result)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_figure(result: BenchResult) -> Figure:
    """The plot of write_plot. Every point of both lines carries its level's label (p99's
    above the point, p50's below), and the axes grow until every label lies inside them:
    labels are offset in points from their point, so the extreme ones would otherwise be
    cut at the figure's edge."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result.config
    levels = result.levels
    xs = [level.throughput * c.batch_size for level in levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    first = "rate" if c.request_rates else "c"
    low, high = min(xs, default=0.0), max(xs, default=0.0)
    labels = []
    for key, style, offset, va in (("p50", "o-", -6, "top"), ("p99", "s--", 6, "bottom")):
        ys = [level.latency_ms[key] for level in levels]
        ax.plot(xs, ys, style, label=key)
        for x, y, level in zip(xs, ys, levels, strict=True):
            if math.isnan(y):
                continue  # no successful request at this level: no point to label
            # Extreme points get labels that extend inwards, the others centred.
            ha = "left" if x == low and high > low else "right" if x == high > low else "center"
            labels.append(
                ax.annotate(
                    f"{first}={level.value:g}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(0, offset),
                    ha=ha,
                    va=va,
                    fontsize=8,
                )
            )
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    title = f"{c.model} over {c.protocol} ({c.encoding})"
    ax.set_title(title + (" (interrupted)" if result.interrupted else ""))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _fit_labels(fig, ax, labels)
    return fig


def _fit_labels(fig: Figure, ax: Axes, labels: list[Annotation]) -> None:
    """Widen the axes' limits until every label's box lies inside the axes. A few rounds:
    widening moves the points inwards, while the labels keep their size in pixels."""
    for _ in range(5):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        frame = ax.get_window_extent(renderer)
        boxes = [label.get_window_extent(renderer) for label in labels]
        pad = 4.0  # pixels between a label and the frame
        over_left = max([frame.x0 + pad - b.x0 for b in boxes] + [0.0])
        over_right = max([b.x1 - (frame.x1 - pad) for b in boxes] + [0.0])
        over_bottom = max([frame.y0 + pad - b.y0 for b in boxes] + [0.0])
        over_top = max([b.y1 - (frame.y1 - pad) for b in boxes] + [0.0])
        if not any((over_left, over_right, over_bottom, over_top)):
            return
        to_data = ax.transData.inverted()
        (x0, y0), (x1, y1) = to_data.transform(
            [
                (frame.x0 - over_left, frame.y0 - over_bottom),
                (frame.x1 + over_right, frame.y1 + over_top),
            ]
        )
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
