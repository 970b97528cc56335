"""The health score of a model version: recent latency, throughput and errors in one number.

The event loop records each request's outcome; the metrics endpoint scores at scrape time,
from threads of its own (one per scrape, several at once when several scrapers come). The
two share only a deque of samples, through a lock held for one append or one C-level copy,
never while Python code iterates: iterating the live deque from a scrape thread while the
loop appended to it failed scrapes with `deque mutated during iteration` (issue #13).
docs/metrics.md defines the score.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from operator import itemgetter

import numpy as np

WINDOW_S = 60.0
BASELINE_FACTOR = 4.0  # default p99 baseline: 4x the best windowed p99 seen
IDLE_SCORE = 0.7  # no request in the window: no latency or error problem, no throughput
MAX_SAMPLES = 100_000  # a bound on memory: past it the window holds the latest requests

_at = itemgetter(0)
_latency = itemgetter(1)
FAILED = float("nan")  # a failed request's latency: it has none to count


class HealthWindow:
    """Recent outcomes of one model version, as (monotonic time, latency s or FAILED)."""

    __slots__ = ("_lock", "_samples", "_scoring", "best_p99_s", "max_throughput", "window_s")

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()  # the samples: the loop's append vs a scrape's copy
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._scoring = threading.Lock()  # one score at a time: the bests below are shared
        self.best_p99_s = 0.0
        self.max_throughput = 0.0

    def record(self, latency_s: float, succeeded: bool) -> None:
        """One request's outcome; on the request path, so only an append under the lock."""
        with self._lock:
            # Timed under the lock, so the deque stays in time order whoever records.
            self._samples.append((time.monotonic(), latency_s if succeeded else FAILED))

    def __len__(self) -> int:
        """Samples held: the window's, and any expired since the last score."""
        return len(self._samples)

    def _recent(self, now: float) -> list[tuple[float, float]]:
        """The window's samples as a list of our own; the expired ones leave the deque."""
        with self._lock:
            snapshot = list(self._samples)  # C-level: no Python code runs mid-copy
            start = bisect_left(snapshot, now - self.window_s, key=_at)
            if start:
                self._samples = deque(snapshot[start:], maxlen=MAX_SAMPLES)
        return snapshot[start:]

    def score(self, baseline_s: float | None) -> float:
        """0.4·(1 − min(1, p99/baseline)) + 0.3·min(1, throughput/max) + 0.3·(1 − errors)."""
        with self._scoring:
            now = time.monotonic()
            samples = self._recent(now)
            if not samples:
                return IDLE_SCORE
            # Vectorised: a scrape of a busy version reads up to MAX_SAMPLES of them.
            latencies = np.fromiter(map(_latency, samples), np.float64, count=len(samples))
            ok = latencies[~np.isnan(latencies)]
            errors = len(samples) - len(ok)
            p99 = 0.0
            if len(ok):
                rank = min(len(ok) - 1, int(0.99 * len(ok)))  # of the sorted latencies
                p99 = float(np.partition(ok, rank)[rank])
                if self.best_p99_s == 0.0 or p99 < self.best_p99_s:
                    self.best_p99_s = p99
            baseline = baseline_s or self.best_p99_s * BASELINE_FACTOR
            span_s = max(1.0, min(self.window_s, now - samples[0][0]))
            throughput = len(ok) / span_s
            self.max_throughput = max(self.max_throughput, throughput)
            latency_term = 1.0
            if not len(ok):
                latency_term = 0.0  # every request failed: no latency to be proud of
            elif baseline > 0:
                latency_term = 1 - min(1.0, p99 / baseline)
            throughput_term = (
                min(1.0, throughput / self.max_throughput) if self.max_throughput else 0.0
            )
            return 0.4 * latency_term + 0.3 * throughput_term + 0.3 * (1 - errors / len(samples))
