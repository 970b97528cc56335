"""Render a benchmark's results: a text table, CSV, JSON and a latency-vs-throughput plot."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inferd.bench.errors import BenchError
from inferd.bench.runner import BenchResult, LevelResult
from inferd.bench.stats import PERCENTILES, percentile_key

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
                f"{level.windows}{'' if level.stable else ' (unstable)'}",
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
        "stable": level.stable,
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
            "server_stats": result.server_stats,
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
    """p50 and p99 latency against throughput, one point per level, labelled with it."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result.config
    levels = result.levels
    xs = [level.throughput * c.batch_size for level in levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("p50", "o-"), ("p99", "s--")):
        ax.plot(xs, [level.latency_ms[key] for level in levels], style, label=key)
    first = "rate" if c.request_rates else "c"
    for x, level in zip(xs, levels, strict=True):
        ax.annotate(
            f"{first}={level.value:g}",
            (x, level.latency_ms["p99"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{c.model} over {c.protocol} ({c.encoding})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
