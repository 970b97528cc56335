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
    embeddings = any(o.accuracy is not None and o.accuracy.embeddings for o in report.outcomes)
    if embeddings:
        head += ["cos_min", "nn_agree"]
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

    rows.append(
        ["original", *speed_cells(report.original), "1.00x", "-"] + ["-"] * (2 * embeddings)
    )
    for o in report.outcomes:
        has_drop = o.accuracy is not None and o.accuracy.has_drop
        drop = _percent(o.accuracy.drop) if o.accuracy is not None and has_drop else "-"
        gain = "-" if math.isnan(o.speedup) else f"{o.speedup:.2f}x"
        row = [o.name + (" *" if o.winner else ""), *speed_cells(o.speed), gain, drop]
        if embeddings:
            row += _embedding_cells(o)
        rows.append(row)
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
    for key in ("validation", "calibration", "labels", "warning"):
        if key in report.data_notes:
            lines.append(f"{key}: {report.data_notes[key]}")
    return "\n".join(lines)


def _embedding_cells(outcome: Outcome) -> list[str]:
    """The least cosine similarity and nearest-neighbour agreement over its embeddings."""
    found = [] if outcome.accuracy is None else outcome.accuracy.embeddings
    figures = [o.embedding for o in found if o.embedding is not None]
    if not figures:
        return ["-", "-"]
    if not all(f.is_finite for f in figures):
        return ["nan", "-"]
    cosine = min(f.cosine_min for f in figures)
    agreement = min(f.neighbour_agreement for f in figures)
    return [f"{cosine:.4f}", _percent(agreement)]


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
            "min_cosine": report.rules.min_cosine,
            "min_neighbour_agreement": report.rules.min_neighbour_agreement,
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


def _plotted_loss(outcome: Outcome, by_cosine: bool) -> float:
    assert outcome.accuracy is not None
    if not by_cosine:
        return outcome.accuracy.drop
    # 1 - the least cosine similarity over its embeddings (inf where one is not finite)
    return max((o.drop for o in outcome.accuracy.embeddings), default=0.0)


def write_plot(report: Report, path: Path) -> None:
    """p50 latency at the preferred batch against accuracy drop (for a model whose only
    outputs are embeddings: against 1 - the least cosine similarity): the original, each
    measured candidate (green when eligible, red when not, a star for the winner), and the
    two limits as dashed lines."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = report.batch
    base = report.original.latency[batch].p50_ms
    measured = [o for o in report.outcomes if o.speed is not None and o.accuracy is not None]
    # An embedding model has no accuracy drop: its x axis is the cosine similarity lost.
    by_cosine = bool(measured) and not any(o.accuracy and o.accuracy.has_drop for o in measured)
    limit = (1 - report.rules.min_cosine if by_cosine else report.rules.max_accuracy_drop) * 100
    drops = [_plotted_loss(o, by_cosine) * 100 for o in measured]
    finite = [d for d in drops if math.isfinite(d)]
    right = max([limit, *finite, 0.1]) * 1.3
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
    ax.axvline(limit, color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(-right * 0.05, right * 1.1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("1 - least cosine similarity (%)" if by_cosine else "accuracy drop (%)")
    ax.set_ylabel(f"p50 latency at batch {batch} (ms)")
    winner = report.winner.name if report.winner else "none"
    ax.set_title(f"{report.model.name} v{report.model.version}: winner {winner}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
