"""Recent request outcomes over a time window: one estimator of request count, error rate and p99
latency, for the health score (health_score.py), the canary guard (repository/canary_guard.py) and
the circuit breaker (circuit.py).

Recording is an append under a lock (the event loop records; the metrics endpoint reads
from threads of its own). A summary copies the samples in one C-level call, drops those
older than the window, and computes on its own copy: iterating the live deque while the loop
appended to it failed scrapes with `deque mutated during iteration` (issue #13).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from operator import itemgetter
from typing import NamedTuple

import numpy as np

_at = itemgetter(0)
_latency = itemgetter(1)
FAILED = float("nan")  # a failed request's latency: it has none to count


class WindowSummary(NamedTuple):
    requests: int
    errors: int
    p99_s: float  # of the successful requests' latencies; 0.0 when none succeeded
    first_at: float  # monotonic time of the window's oldest sample (0.0: no sample)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


class SlidingWindow:
    """Outcomes as (monotonic time, latency s or FAILED), oldest first; past `maxlen` the
    window holds the latest ones (a bound on memory)."""

    __slots__ = ("_lock", "_samples", "maxlen")

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque(maxlen=maxlen)

    def record(self, latency_s: float, succeeded: bool, now: float | None = None) -> None:
        """One request's outcome; on the request path, so only an append under the lock."""
        with self._lock:
            # Timed under the lock, so the deque stays in time order whoever records.
            at = time.monotonic() if now is None else now
            self._samples.append((at, latency_s if succeeded else FAILED))

    def __len__(self) -> int:
        """Samples held: the window's, and any expired since the last summary."""
        return len(self._samples)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()

    def summary(self, window_s: float, now: float | None = None) -> WindowSummary:
        """The outcomes of the last `window_s` seconds; older ones leave the window."""
        if now is None:
            now = time.monotonic()
        with self._lock:
            snapshot = list(self._samples)  # C-level: no Python code runs mid-copy
            start = bisect_left(snapshot, now - window_s, key=_at)
            if start:
                self._samples = deque(snapshot[start:], maxlen=self.maxlen)
        samples = snapshot[start:]
        if not samples:
            return WindowSummary(0, 0, 0.0, 0.0)
        # Vectorised: a busy version's window holds up to `maxlen` samples.
        latencies = np.fromiter(map(_latency, samples), np.float64, count=len(samples))
        ok = latencies[~np.isnan(latencies)]
        p99 = 0.0
        if len(ok):
            rank = min(len(ok) - 1, int(0.99 * len(ok)))  # of the sorted latencies
            p99 = float(np.partition(ok, rank)[rank])
        return WindowSummary(len(samples), len(samples) - len(ok), p99, samples[0][0])
