"""Pure arithmetic of a benchmark: percentiles, windows, the stability criterion, and the
server-side split from two snapshots of Triton's statistics."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of already sorted values: the smallest value
    with at least q% of the values at or below it. NaN for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    n = len(sorted_values)
    if n == 0:
        return math.nan
    # The tiny epsilon keeps q*n/100 from landing just above an integer through rounding.
    rank = max(1, math.ceil(q * n / 100.0 - 1e-9))
    return float(sorted_values[min(rank, n) - 1])


def percentile_key(q: float) -> str:
    """50.0 -> 'p50', 99.9 -> 'p99.9'."""
    return f"p{q:g}"


# Failed requests keep their messages, but only a sample: a failing model fails thousands of
# requests a second, often with a message that differs per request (sizes, ids).
MAX_ERROR_MESSAGES = 8  # distinct messages kept
MAX_ERROR_MESSAGE_CHARS = 300


@dataclass
class Samples:
    """What a load source recorded between two drains: one latency (seconds) per successful
    request, a count per outcome (HTTP status or gRPC code; 'OK'/'200' count as success),
    how many requests were sent (intended sends, in open loop), and a sample of the failed
    requests' messages ('<outcome>: <message>', each with its count)."""

    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    error_messages: Counter[str] = field(default_factory=Counter)

    def extend(self, other: Samples) -> None:
        self.latencies.extend(other.latencies)
        self.outcomes.update(other.outcomes)
        self.sent += other.sent
        for message, count in other.error_messages.items():
            self.note_error(message, count)

    def note_error(self, message: str, count: int = 1) -> None:
        """Count a failed request's message, among the first MAX_ERROR_MESSAGES distinct."""
        message = message[:MAX_ERROR_MESSAGE_CHARS]
        if message in self.error_messages or len(self.error_messages) < MAX_ERROR_MESSAGES:
            self.error_messages[message] += count

    @property
    def completed(self) -> int:
        return sum(self.outcomes.values())

    @property
    def successes(self) -> int:
        return len(self.latencies)

    @property
    def errors(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.outcomes.items()) if k not in SUCCESS}


SUCCESS = frozenset({"200", "OK"})


@dataclass
class WindowStats:
    """One measurement window: throughput counts successful requests per second."""

    duration_s: float
    samples: Samples
    latency_s: dict[str, float]

    @property
    def throughput(self) -> float:
        return self.samples.successes / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def p99(self) -> float:
        return self.latency_s["p99"]


def latency_summary(latencies: Iterable[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    out = {percentile_key(q): percentile(ordered, q) for q in PERCENTILES}
    out["avg"] = sum(ordered) / len(ordered) if ordered else math.nan
    out["min"] = ordered[0] if ordered else math.nan
    out["max"] = ordered[-1] if ordered else math.nan
    return out


def window(duration_s: float, samples: Samples) -> WindowStats:
    return WindowStats(duration_s, samples, latency_summary(samples.latencies))


def within(values: Sequence[float], percentage: float) -> bool:
    """Every value within `percentage`% of the values' mean (NaN never is)."""
    if not values or any(math.isnan(v) for v in values):
        return False
    mean = sum(values) / len(values)
    if mean == 0:
        return all(v == 0 for v in values)
    return all(abs(v - mean) <= percentage / 100.0 * abs(mean) for v in values)


def is_stable(windows: Sequence[WindowStats], percentage: float, count: int = 3) -> bool:
    """perf_analyzer's criterion: the last `count` windows' throughputs are each within
    `percentage`% of their mean, and so are their p99 latencies. A window with no
    successful request is never stable."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    if any(w.samples.successes == 0 for w in last):
        return False
    return within([w.throughput for w in last], percentage) and within(
        [w.p99 for w in last], percentage
    )


# --- the server-side split -------------------------------------------------------------

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def stats_totals(model_stats: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Sum Triton's `model_stats` entries (all versions) into flat counters:
    '<name>_count' and '<name>_ns' per duration, plus inference_count and execution_count."""
    totals: dict[str, int] = Counter()
    for entry in model_stats:
        inference = entry.get("inference_stats", {})
        for name in _DURATIONS:
            d = inference.get(name, {})
            totals[f"{name}_count"] += int(d.get("count", 0))
            totals[f"{name}_ns"] += int(d.get("ns", 0))
        totals["inference_count"] += int(entry.get("inference_count", 0))
        totals["execution_count"] += int(entry.get("execution_count", 0))
        # inferd's own, for a model that pads (pad_inputs): what requests sent, what it ran.
        padding = entry.get("padding", {})
        totals["real_elements"] += int(padding.get("real_elements", 0))
        totals["padded_elements"] += int(padding.get("padded_elements", 0))
    return dict(totals)


def server_split(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, float]:
    """Per-request server-side averages (microseconds) between two snapshots: the time in the
    queue and in compute_input / compute_infer / compute_output, as Triton counts them (a
    request counts its whole batch's compute time), the average batch size, and for a model
    that pads its inputs, the padding's share of the elements it ran, in percent."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    successes = delta.get("success_count", 0)
    out: dict[str, float] = {
        "requests": float(successes),
        "failures": float(delta.get("fail_count", 0)),
        "inferences": float(delta.get("inference_count", 0)),
        "executions": float(delta.get("execution_count", 0)),
    }

    def avg_us(name: str) -> float:
        count = delta.get(f"{name}_count", 0)
        return delta.get(f"{name}_ns", 0) / count / 1000.0 if count else math.nan

    out["request_us"] = avg_us("success")
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        out[f"{name}_us"] = avg_us(name)
    execs = delta.get("execution_count", 0)
    out["avg_batch"] = delta.get("inference_count", 0) / execs if execs else math.nan
    # A padding model's share of what it ran that was padding (NaN: it pads nothing).
    padded = delta.get("padded_elements", 0)
    out["padding_pct"] = (
        100.0 * (padded - delta.get("real_elements", 0)) / padded if padded else math.nan
    )
    return out
