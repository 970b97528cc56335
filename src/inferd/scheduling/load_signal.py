"""How busy a model version's instances are, and how much of them its demand needs: the
load signal an autoscaler scales on (`inferd_instance_utilization`,
`inferd_capacity_ratio`; docs/metrics.md).

Per second of the last WINDOW_S, the window keeps the execution time its instances spent,
the rows they finished and the rows that arrived. The event loop writes (one list add per
request, a few per batch); a scrape thread reads, without a lock: each slot is one list
item, and a slot read while the loop recycles it is off by one second's counts at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 30  # long enough to smooth batches, short enough for an autoscaler to follow
_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One version's window, in instance-nanoseconds; sums of samples are samples."""

    busy_ns: int  # executing (finished executions, and the running ones so far)
    capacity_ns: int  # the instances' time: instances x the window's length
    demand_ns: int  # the execution time the rows that arrived need at the current cost

    @property
    def utilization(self) -> float:
        return min(1.0, self.busy_ns / self.capacity_ns) if self.capacity_ns > 0 else 0.0

    @property
    def capacity_ratio(self) -> float:
        return self.demand_ns / self.capacity_ns if self.capacity_ns > 0 else 0.0

    def __add__(self, other: LoadSample) -> LoadSample:
        return LoadSample(
            self.busy_ns + other.busy_ns,
            self.capacity_ns + other.capacity_ns,
            self.demand_ns + other.demand_ns,
        )


IDLE = LoadSample(0, 0, 0)


class LoadWindow:
    __slots__ = (
        "instances", "_n", "_busy", "_rows", "_arrived", "_second", "_started", "_active",
        "_clock", "_total_busy", "_total_rows",
    )  # fmt: skip

    def __init__(
        self,
        instances: int,
        window_s: int = WINDOW_S,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.instances = instances
        self._n = window_s
        self._busy = [0] * window_s  # ns executed in that second
        self._rows = [0] * window_s  # rows whose execution finished in that second
        self._arrived = [0] * window_s  # rows submitted in that second (shed ones included)
        self._second = [-1] * window_s  # which second each slot holds now
        self._started = [0] * instances  # per instance: its running execution's start, or 0
        self._clock = clock
        # When the first request arrived: the window never reaches back before it, so a
        # replica that just started reads as busy as it is, not diluted by its idle start.
        self._active = 0
        self._total_busy = 0  # since load: the cost of a row when the window has none
        self._total_rows = 0

    def _slot(self, second: int) -> int:
        i = second % self._n
        if self._second[i] != second:  # recycled: that second left the window
            self._busy[i] = self._rows[i] = self._arrived[i] = 0
            self._second[i] = second
        return i

    def arrived(self, rows: int, now: int | None = None) -> None:
        """`rows` submitted; `now` (the window's clock) when the caller has just read it."""
        if now is None:
            now = self._clock()
        if not self._active:
            self._active = now
        second = now // _NS
        i = second % self._n
        if self._second[i] == second:  # _slot's common case, inline: once per request
            self._arrived[i] += rows
        else:
            self._arrived[self._slot(second)] += rows

    def started(self, instance: int, start_ns: int) -> None:
        if not self._active:  # warm-up executes before any request arrives
            self._active = start_ns
        self._started[instance] = start_ns

    def finished(self, instance: int, start_ns: int, end_ns: int, rows: int) -> None:
        """An execution of `rows` rows on `instance` ran from start_ns to end_ns."""
        self._started[instance] = 0
        first, last = start_ns // _NS, end_ns // _NS
        first = max(first, last - self._n + 1)  # the older part is out of the window anyway
        for second in range(first, last + 1):
            lo, hi = max(start_ns, second * _NS), min(end_ns, (second + 1) * _NS)
            self._busy[self._slot(second)] += hi - lo
        self._rows[self._slot(last)] += rows
        self._total_busy += end_ns - start_ns
        self._total_rows += rows

    def sample(self) -> LoadSample:
        """The last WINDOW_S seconds (or the time since the first request, if shorter)."""
        if not self._active:
            return IDLE
        now = self._clock()
        current = now // _NS
        oldest = current - self._n + 1
        since = max(oldest * _NS, self._active)
        elapsed = now - since
        if elapsed <= 0:
            return IDLE
        busy = rows = arrived = 0
        for i in range(self._n):
            if oldest <= self._second[i] <= current:
                busy += self._busy[i]
                rows += self._rows[i]
                arrived += self._arrived[i]
        running = sum(now - max(start, since) for start in list(self._started) if start)
        if rows:
            demand = arrived * busy // rows
        elif self._total_rows:
            demand = arrived * self._total_busy // self._total_rows
        else:  # nothing has finished yet: what the instances are doing is all we know
            demand = busy + running
        return LoadSample(busy + running, elapsed * self.instances, demand)
