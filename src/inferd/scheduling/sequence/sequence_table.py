"""The sequence table: which sequences are live, the batch slot each one holds, the backlog
of sequences waiting for a slot, each sequence's implicit state, and idle expiry.

A sequence starts with a request flagged START, holds one slot of one instance (a "lane")
until its END request has executed or it has been idle for `max_sequence_idle_microseconds`,
and then frees the slot for the oldest sequence of the backlog (Triton's sequence batcher).
Everything here runs on the event loop and takes its clock as an argument, so the unit tests
drive it without threads or sleeps.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inferd.errors import invalid
from inferd.scheduling.pending import Pending
from inferd.tensors.signature import BoundRequest
from inferd.types import SEQUENCE_END, SEQUENCE_START, Array

log = logging.getLogger("inferd.scheduling")

CorrelationId = int | str
END = "end"  # the reasons a sequence is released (the metric's `reason` label)
IDLE = "idle"
UNLOAD = "unload"  # idle when its model version was unloaded
REMEMBERED = 4096  # released sequence ids kept to say why a late request is refused


@dataclass(eq=False, slots=True)
class SequenceEntry:
    correlation_id: CorrelationId
    queue: deque[Pending] = field(default_factory=deque)  # its requests, in arrival order
    lane: int = -1  # the instance it is bound to; -1 while in the backlog
    slot: int = -1  # its batch slot on that instance
    state: dict[str, Array] | None = None  # None: the next step takes the initial state
    ending: bool = False  # its END request was submitted (and no START after it)
    executing: bool = False  # one of its requests is in a running batch
    idle_since: float | None = None  # when it last had nothing queued nor executing

    @property
    def has_slot(self) -> bool:
        return self.lane >= 0


class SequenceTable:
    def __init__(
        self,
        model: str,
        lanes: int,
        slots: int,
        idle_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.model = model
        self.idle_s = idle_s
        self._clock = clock
        self.slots = slots
        self.by_id: dict[CorrelationId, SequenceEntry] = {}  # live: holding a slot or backlogged
        self.lanes: list[list[SequenceEntry | None]] = [[None] * slots for _ in range(lanes)]
        self._free: list[list[int]] = [list(range(slots)) for _ in range(lanes)]  # min-heaps
        self.backlog: deque[SequenceEntry] = deque()
        self.released: dict[str, int] = {END: 0, IDLE: 0}
        self._gone: OrderedDict[CorrelationId, str] = OrderedDict()  # id -> why released
        # (idle_since, entry) in the order sequences went idle: the reaper's to-do list.
        self._idle: deque[tuple[float, SequenceEntry]] = deque()

    # -- admission ------------------------------------------------------------------------

    def admit(self, request: BoundRequest) -> SequenceEntry:
        """The sequence a request joins (a new one when it starts one); refuses, naming the
        sequence, a request that belongs to no live sequence."""
        cid = request.correlation_id
        starts = bool(request.flags & SEQUENCE_START)
        entry = self.by_id.get(cid)
        if entry is None:
            if not starts:
                raise invalid(self._not_live(cid))
            entry = SequenceEntry(cid)
            self.by_id[cid] = entry
            self._gone.pop(cid, None)
            self._place(entry)
        elif starts:
            if not entry.ending:
                # Triton's rule: the old sequence did not end; its queued requests still
                # run, then the new one starts in the same slot from the initial state.
                log.warning(
                    "model %s: sequence %s started again before it ended; the previous "
                    "sequence ends early",
                    self.model,
                    cid,
                )
            entry.ending = False
        elif entry.ending:
            raise invalid(
                f"inference request for sequence {cid} to model '{self.model}': the sequence "
                "already ended (its sequence_end request was sent); start a new one with "
                "sequence_start"
            )
        if request.flags & SEQUENCE_END:
            entry.ending = True
        entry.idle_since = None
        return entry

    def _not_live(self, cid: CorrelationId) -> str:
        why = self._gone.get(cid)
        detail = ""
        if why == END:
            detail = f" (sequence {cid} already ended)"
        elif why == IDLE:
            detail = (
                f" (sequence {cid} was released after {self.idle_s:g} s without requests: "
                "max_sequence_idle_microseconds)"
            )
        return (
            f"inference request for sequence {cid} to model '{self.model}' must specify the "
            f"START flag (sequence_start) on the first request of the sequence{detail}"
        )

    def _place(self, entry: SequenceEntry) -> None:
        """Give the sequence a free slot, on the instance with the most free slots (spreads
        sequences over instances); the backlog when there is none."""
        best = max(range(len(self._free)), key=lambda lane: len(self._free[lane]))
        if not self._free[best]:
            self.backlog.append(entry)
            return
        self._bind(entry, best, heapq.heappop(self._free[best]))

    def _bind(self, entry: SequenceEntry, lane: int, slot: int) -> None:
        entry.lane, entry.slot = lane, slot
        self.lanes[lane][slot] = entry

    # -- completion and release -----------------------------------------------------------

    def step_done(self, entry: SequenceEntry, now: float) -> SequenceEntry | None:
        """A request of `entry` finished (or was dropped unexecuted). Releases the sequence
        when it ended and nothing of it is queued; marks it idle when nothing is queued.
        Returns the backlogged sequence that took a freed slot, if any."""
        if entry.executing or self._live_queue(entry):
            return None
        if entry.ending:
            return self.release(entry, END)
        if entry.idle_since is None and entry.has_slot:
            entry.idle_since = now
            self._idle.append((now, entry))
        return None

    @staticmethod
    def _live_queue(entry: SequenceEntry) -> bool:
        queue = entry.queue
        while queue and queue[0].future.done():  # timed out or cancelled while queued
            queue.popleft()
        return bool(queue)

    def release(self, entry: SequenceEntry, reason: str) -> SequenceEntry | None:
        """Forget the sequence and free its slot; the oldest backlogged sequence takes it
        (and is returned, so that its instance can be woken)."""
        if self.by_id.get(entry.correlation_id) is entry:
            del self.by_id[entry.correlation_id]
        self.released[reason] = self.released.get(reason, 0) + 1
        self._gone[entry.correlation_id] = reason
        self._gone.move_to_end(entry.correlation_id)
        while len(self._gone) > REMEMBERED:
            self._gone.popitem(last=False)
        entry.idle_since = None
        entry.state = None
        if not entry.has_slot:
            if entry in self.backlog:  # it ended (or its requests went away) while waiting
                self.backlog.remove(entry)
            return None
        lane, slot = entry.lane, entry.slot
        self.lanes[lane][slot] = None
        entry.lane = entry.slot = -1
        if self.backlog:
            waiting = self.backlog.popleft()
            self._bind(waiting, lane, slot)
            return waiting
        heapq.heappush(self._free[lane], slot)
        return None

    # -- idle expiry ----------------------------------------------------------------------

    def expire(self, now: float, reason: str = IDLE) -> list[SequenceEntry]:
        """Release the sequences idle for `idle_s` or longer; returns the backlogged
        sequences that took their slots."""
        woken: list[SequenceEntry] = []
        idle = self._idle
        while idle and idle[0][0] + self.idle_s <= now:
            since, entry = idle.popleft()
            if entry.idle_since != since or self.by_id.get(entry.correlation_id) is not entry:
                continue  # it was busy again since, or is gone: a stale entry of the list
            if reason == IDLE:
                log.info(
                    "model %s: sequence %s released after %.3f s idle",
                    self.model,
                    entry.correlation_id,
                    now - since,
                )
            taker = self.release(entry, reason)
            if taker is not None:
                woken.append(taker)
        return woken

    def next_expiry(self) -> float | None:
        """When the next idle sequence expires (clock time), or None if none is idle."""
        idle = self._idle
        while idle:
            since, entry = idle[0]
            if entry.idle_since == since and self.by_id.get(entry.correlation_id) is entry:
                return since + self.idle_s
            idle.popleft()
        return None

    # -- views ----------------------------------------------------------------------------

    def active(self) -> int:
        """Sequences holding a slot."""
        return len(self.by_id) - len(self.backlog)

    def state_of(self, entry: SequenceEntry, request: BoundRequest) -> dict[str, Array] | None:
        """The state the request's step takes: None for the initial one (a START, or a
        sequence whose first step produced none)."""
        if request.flags & SEQUENCE_START:
            return None
        return entry.state
