"""Speed, measured in process: load time, model size, and per batch size the latency of one
call (p50, p99) and the rows per second that follow from it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inferd_tools.optimize.runners import Runner


@dataclass(frozen=True)
class MeasureSettings:
    duration_s: float = 2.0  # per batch size, after the warm-up runs
    warmup_runs: int = 5
    min_runs: int = 20  # even past duration_s, so a p99 has some samples behind it


@dataclass
class Latency:
    batch: int
    runs: int
    p50_ms: float
    p99_ms: float
    throughput: float  # rows per second: runs x batch over the time they took

    def to_json(self) -> dict[str, float | int]:
        return {
            "batch": self.batch,
            "runs": self.runs,
            "p50_ms": round(self.p50_ms, 4),
            "p99_ms": round(self.p99_ms, 4),
            "throughput_rows_per_s": round(self.throughput, 1),
        }


@dataclass
class Speed:
    load_s: float
    size_bytes: int
    latency: dict[int, Latency] = field(default_factory=dict)  # by batch size

    def to_json(self) -> dict[str, object]:
        return {
            "load_s": round(self.load_s, 4),
            "size_bytes": self.size_bytes,
            "latency": [self.latency[b].to_json() for b in sorted(self.latency)],
        }


def time_calls(
    call: Callable[[], object], batch: int, settings: MeasureSettings, clock: Callable[[], float]
) -> Latency:
    for _ in range(settings.warmup_runs):
        call()
    samples: list[float] = []
    started = clock()
    end = started + settings.duration_s
    while True:
        before = clock()
        call()
        after = clock()
        samples.append(after - before)
        if after >= end and len(samples) >= settings.min_runs:
            break
    elapsed = clock() - started
    ms = np.asarray(samples) * 1000.0
    return Latency(
        batch=batch,
        runs=len(samples),
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
        throughput=len(samples) * batch / elapsed if elapsed > 0 else float("nan"),
    )


def measure(
    runner: Runner,
    path: Path,
    feeds: dict[int, dict[str, np.ndarray]],
    settings: MeasureSettings,
    progress: Callable[[str], None],
) -> Speed:
    """`feeds`: one feed per batch size to measure."""
    speed = Speed(load_s=runner.load_s, size_bytes=path.stat().st_size)
    for batch, feed in sorted(feeds.items()):
        progress(f"timing batch {batch} ({settings.duration_s:g} s)")
        speed.latency[batch] = time_calls(
            lambda feed=feed: runner.run(feed),  # type: ignore[misc]
            batch,
            settings,
            time.perf_counter,
        )
    return speed
