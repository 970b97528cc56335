"""When the soak does what (its plan), the windows its faults open, and which versions of a
model may answer at a given time.

The plan of a long run (30 minutes by default) repeats: a hot swap every minute
(alternately `linear_noconfig`, an ONNX model with new weights, and `text_stats`, a Python
model loaded again), a burst every 5 minutes, and every 10 minutes a canary of mlp (10%,
promoted, rolled back, retired), Redis killed and restarted, and a worker killed. A run
shorter than 10 minutes does each once, spread over the run; its swaps come every
`min(60, duration / 4)` seconds.

A fault opens a window from when it starts until it is over (the burst's clients done, Redis
answering again, the killed worker listening again) plus `WINDOW_MARGIN_S`. Valid requests
whose time overlaps a window may be refused in the ways that fault allows; outside every
window they may not.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

WINDOW_MARGIN_S = 5.0
LONG_RUN_S = 600.0

# Fault kinds, and what a valid request overlapping their window may get besides its answer.
BURST, WORKER_KILL, REDIS_KILL = "burst", "worker_kill", "redis_kill"
REFUSALS = frozenset({"429", "503", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "stream_error"})
ALLOWED: dict[str, frozenset[str]] = {
    BURST: REFUSALS,
    REDIS_KILL: REFUSALS,
    WORKER_KILL: REFUSALS | {"lost"},  # connections open on the killed worker
}


@dataclass(frozen=True)
class Step:
    at_s: float
    action: str  # swap_linear, swap_text_stats, canary, promote, rollback, retire, burst,
    # kill_redis, restart_redis, kill_worker
    length_s: float = 0.0  # a burst's length; how long Redis stays down


# Steps the soak takes on its main thread (each other step has a thread of its own): they
# start a child that must die with the soak, whose parent-death signal is its thread's.
MAIN_THREAD_STEPS = frozenset({"restart_redis"})


def plan(duration_s: float) -> list[Step]:
    """Every step of a run of `duration_s`, in time order."""
    steps: list[Step] = []
    swap_every = min(60.0, duration_s / 4)
    for n in range(1, math.ceil(duration_s / swap_every)):
        if n * swap_every <= duration_s - 20:
            steps.append(Step(n * swap_every, "swap_linear" if n % 2 else "swap_text_stats"))
    if duration_s >= LONG_RUN_S:
        fault_s = 20.0
        for start in range(0, int(duration_s) - 120, 600):
            steps += [
                Step(start + 200, "canary"),
                Step(start + 260, "promote"),
                Step(start + 320, "rollback"),
                Step(start + 380, "retire"),
                Step(start + 400, "kill_redis", fault_s),
                Step(start + 400 + fault_s, "restart_redis"),
                Step(start + 500, "kill_worker"),
            ]
        for start in range(150, int(duration_s) - 60, 300):
            steps.append(Step(start, "burst", fault_s))
    else:
        d, fault_s = duration_s, min(20.0, duration_s / 12)
        steps += [
            Step(0.15 * d, "burst", fault_s),
            Step(0.30 * d, "canary"),
            Step(0.45 * d, "promote"),
            Step(0.60 * d, "rollback"),
            Step(0.75 * d, "retire"),
            Step(0.40 * d, "kill_redis", fault_s),
            Step(0.40 * d + fault_s, "restart_redis"),
            Step(0.55 * d, "kill_worker"),
        ]
    steps = [s for s in steps if s.at_s < duration_s]
    return sorted(steps, key=lambda s: s.at_s)


def default_warmup_s(duration_s: float) -> float:
    """Before it, memory may grow (buffers, caches, the first burst's high-water mark)."""
    return 300.0 if duration_s >= 4 * 300 else duration_s / 4


@dataclass
class Window:
    kind: str
    start: float
    end: float | None = None  # None: still open


@dataclass
class Windows:
    """The faults' windows on the monotonic clock (the soak's processes share it)."""

    _windows: list[Window] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, kind: str) -> Window:
        window = Window(kind, time.monotonic())
        with self._lock:
            self._windows.append(window)
        return window

    def close(self, window: Window) -> None:
        window.end = time.monotonic() + WINDOW_MARGIN_S

    def covering(self, start: float, end: float) -> set[str]:
        """Kinds of the windows that overlap [start, end]."""
        with self._lock:
            return {
                w.kind
                for w in self._windows
                if w.start <= end and (w.end is None or start <= w.end)
            }

    def all(self) -> list[Window]:
        with self._lock:
            return list(self._windows)


@dataclass
class VersionBook:
    """Which versions of each model may answer: a change (a swap, a canary step) takes
    effect when the soak writes it and the versions before it may still answer for
    `grace_s` (each worker polls the repository and loads the new version beside the old
    one first). An answer from any other version is a finding (`stale_version`)."""

    grace_s: float
    _states: dict[str, list[tuple[float, frozenset[str]]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, model: str, versions: set[str], at: float | None = None) -> None:
        with self._lock:
            # Before its first change, a model serves its version 1.
            states = self._states.setdefault(model, [(-math.inf, frozenset({"1"}))])
            states.append((time.monotonic() if at is None else at, frozenset(versions)))

    def allowed(self, model: str, version: str, sent: float, answered: float) -> bool:
        with self._lock:
            states = list(self._states.get(model, [(-math.inf, frozenset({"1"}))]))
        for i, (start, versions) in enumerate(states):
            end = states[i + 1][0] + self.grace_s if i + 1 < len(states) else math.inf
            if version in versions and start <= answered and sent <= end:
                return True
        return False

    def deployed(self, until: float) -> list[tuple[str, str, float, float]]:
        """(model, version, from, to) of every version deployed by a change, for the time it
        was the newest one (to: the next change, or `until`)."""
        out = []
        with self._lock:
            for model, states in self._states.items():
                for i, (start, versions) in enumerate(states[1:], 1):
                    end = states[i + 1][0] if i + 1 < len(states) else until
                    out += [(model, v, start, end) for v in sorted(versions)]
        return out
