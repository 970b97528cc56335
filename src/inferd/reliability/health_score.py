"""The health score of a model version: recent latency, throughput and errors in one number.

The event loop records each request's outcome; the metrics endpoint scores at scrape time,
from threads of its own (one per scrape, several at once when several scrapers come); the
window of outcomes they share is sliding_window.py's. docs/metrics.md defines the score.
"""

from __future__ import annotations

import threading
import time

from inferd.reliability.sliding_window import SlidingWindow

WINDOW_S = 60.0
BASELINE_FACTOR = 4.0  # default p99 baseline: 4x the best windowed p99 seen
IDLE_SCORE = 0.7  # no request in the window: no latency or error problem, no throughput
MAX_SAMPLES = 100_000  # a bound on memory: past it the window holds the latest requests


class HealthWindow:
    """Recent outcomes of one model version, and the bests its scores are measured against."""

    __slots__ = ("_samples", "_scoring", "best_p99_s", "max_throughput", "window_s")

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples = SlidingWindow(MAX_SAMPLES)
        self._scoring = threading.Lock()  # one score at a time: the bests below are shared
        self.best_p99_s = 0.0
        self.max_throughput = 0.0

    def record(self, latency_s: float, succeeded: bool) -> None:
        """One request's outcome; on the request path, so only an append under a lock."""
        self._samples.record(latency_s, succeeded)

    def __len__(self) -> int:
        """Samples held: the window's, and any expired since the last score."""
        return len(self._samples)

    def score(self, baseline_s: float | None, now: float | None = None) -> float:
        """0.4·(1 − min(1, p99/baseline)) + 0.3·min(1, throughput/max) + 0.3·(1 − errors).
        `now`: the monotonic clock's reading to score at (default: the current one), so
        that two scores of the same outcomes can be compared free of the clock (tests)."""
        with self._scoring:
            if now is None:
                now = time.monotonic()
            window = self._samples.summary(self.window_s, now)
            if not window.requests:
                return IDLE_SCORE
            succeeded = window.requests - window.errors
            p99 = window.p99_s
            if succeeded and (self.best_p99_s == 0.0 or p99 < self.best_p99_s):
                self.best_p99_s = p99
            baseline = baseline_s or self.best_p99_s * BASELINE_FACTOR
            span_s = max(1.0, min(self.window_s, now - window.first_at))
            throughput = succeeded / span_s
            self.max_throughput = max(self.max_throughput, throughput)
            latency_term = 1.0
            if not succeeded:
                latency_term = 0.0  # every request failed: no latency to be proud of
            elif baseline > 0:
                latency_term = 1 - min(1.0, p99 / baseline)
            throughput_term = (
                min(1.0, throughput / self.max_throughput) if self.max_throughput else 0.0
            )
            return 0.4 * latency_term + 0.3 * throughput_term + 0.3 * (1 - window.error_rate)
