"""The report: a terminal table with a line per candidate saying why it won or lost, the
JSON document (also saved beside a published version), and a PNG of latency against
accuracy drop."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd_tools.optimize.errors import OptimizeError
from inferd_tools.optimize.measure import Speed
from inferd_tools.optimize.source import OriginalModel
from inferd_tools.optimize.verdict import Outcome, Rules


@dataclass
class Report:
    model: OriginalModel
    rules: Rules
    original: Speed
    outcomes: list[Outcome]
    winner: Outcome | None
    data_notes: dict[str, str]  # validation, calibration, labels, accuracy basis
    published: dict[str, Any] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.model.preferred_batch


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _size(n: int) -> str:
    return f"{n / 1e6:.2f}MB" if n >= 1e5 else f"{n / 1e3:.1f}kB"


def table(report: Report) -> str:
    sizes = sorted(report.original.latency)
    big = sizes[-1]
    head = ["candidate"]
    for b in sizes:
        head += [f"p50@{b}", f"p99@{b}"]
    head += [f"rows/s@{big}", "size", "load_ms", "speed-up", "drop"]
    rows = [head]

    def speed_cells(speed: Speed | None) -> list[str]:
        if speed is None:
            return ["-"] * (2 * len(sizes) + 3)
        cells = []
        for b in sizes:
            cells += [_ms(speed.latency[b].p50_ms), _ms(speed.latency[b].p99_ms)]
        cells += [f"{speed.latency[big].throughput:.0f}", _size(speed.size_bytes)]
        cells.append(f"{speed.load_s * 1000:.1f}")
        return cells

    rows.append(["original", *speed_cells(report.original), "1.00x", "-"])
    for o in report.outcomes:
        drop = "-" if o.accuracy is None else _percent(o.accuracy.drop)
        gain = "-" if math.isnan(o.speedup) else f"{o.speedup:.2f}x"
        rows.append([o.name + (" *" if o.winner else ""), *speed_cells(o.speed), gain, drop])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    m = report.model
    lines.insert(
        0,
        f"{m.name} version {m.version} ({m.format}), latency in ms per call, speed-up at "
        f"batch {report.batch} (p50), drop against "
        + report.data_notes.get("accuracy_basis", "the original's outputs"),
    )
    lines.append("")
    for o in report.outcomes:
        lines.append(f"{o.name}: {'failed: ' if o.status == 'failed' else ''}{o.reason}")
    if report.winner is None:
        lines.append("no eligible candidate: nothing is published")
    for key in ("validation", "calibration", "labels"):
        if key in report.data_notes:
            lines.append(f"{key}: {report.data_notes[key]}")
    return "\n".join(lines)


def _percent(share: float) -> str:
    return "inf" if math.isinf(share) else f"{share * 100:.2f}%"


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def to_json(report: Report) -> dict[str, Any]:
    m = report.model
    doc = {
        "model": m.name,
        "version": m.version,
        "format": m.format,
        "preferred_batch": report.batch,
        "runtime": {
            "intra_op_threads": m.runtime.intra_op_threads,
            "inter_op_threads": m.runtime.inter_op_threads,
            "parallel_execution": m.runtime.parallel_execution,
            "graph_level": m.runtime.graph_level,
        },
        "rules": {
            "min_speedup": report.rules.min_speedup,
            "max_accuracy_drop": report.rules.max_accuracy_drop,
        },
        "data": report.data_notes,
        "original": report.original.to_json(),
        "candidates": [
            {
                "name": o.name,
                "description": o.description,
                "status": o.status,
                "eligible": o.eligible,
                "winner": o.winner,
                "reason": o.reason,
                "speedup": o.speedup,
                "speed": None if o.speed is None else o.speed.to_json(),
                "accuracy": None if o.accuracy is None else o.accuracy.to_json(),
            }
            for o in report.outcomes
        ],
        "winner": None if report.winner is None else report.winner.name,
        "published": report.published or None,
    }
    finite: dict[str, Any] = _finite(doc)
    return finite


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")


def check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise OptimizeError(
            "--plot needs matplotlib: pip install 'inferd[bench]' (or pip install matplotlib)"
        ) from None


def write_plot(report: Report, path: Path) -> None:
    """p50 latency at the preferred batch against accuracy drop: the original, each
    measured candidate (green when eligible, red when not, a star for the winner), and the
    two limits as dashed lines."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = report.batch
    base = report.original.latency[batch].p50_ms
    measured = [o for o in report.outcomes if o.speed is not None and o.accuracy is not None]
    drops = [o.accuracy.drop * 100 for o in measured if o.accuracy is not None]
    finite = [d for d in drops if math.isfinite(d)]
    right = max([report.rules.max_accuracy_drop * 100, *finite, 0.1]) * 1.3
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([0], [base], "k*", markersize=12)
    ax.annotate("original", (0, base), textcoords="offset points", xytext=(6, 6), fontsize=8)
    placed: list[tuple[float, float]] = [(0.0, base)]
    top = max([base, *(o.speed.latency[batch].p50_ms for o in measured if o.speed)])
    for o, drop in zip(measured, drops, strict=True):
        assert o.speed is not None
        y = o.speed.latency[batch].p50_ms
        x = drop if math.isfinite(drop) else right
        style = "y*" if o.winner else "go" if o.eligible else "rx"
        ax.plot([x], [y], style, markersize=12 if o.winner else 8)
        label = o.name if math.isfinite(drop) else f"{o.name} (drop inf)"
        # Candidates often land on one spot (graph and fp16 beside the original): their
        # labels go one line lower per point already there.
        near = sum(abs(x - px) < right * 0.03 and abs(y - py) < top * 0.03 for px, py in placed)
        placed.append((x, y))
        ax.annotate(
            label, (x, y), textcoords="offset points", xytext=(6, -10 - 10 * near), fontsize=8
        )
    if report.rules.min_speedup > 0:  # the slowest latency still eligible
        ax.axhline(base / report.rules.min_speedup, color="grey", linestyle="--", linewidth=1)
    ax.axvline(report.rules.max_accuracy_drop * 100, color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(-right * 0.05, right * 1.1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("accuracy drop (%)")
    ax.set_ylabel(f"p50 latency at batch {batch} (ms)")
    winner = report.winner.name if report.winner else "none"
    ax.set_title(f"{report.model.name} v{report.model.version}: winner {winner}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
