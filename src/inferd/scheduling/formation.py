"""Batch formation: which queued requests leave together, and why, as a pure function.

`form_batch` reads the queue (in priority order, oldest first within a level), the batching
options and the time; it touches no thread, loop or future, so every rule is unit-testable
(tests/unit/scheduling/test_formation.py). The dynamic batcher (`batcher.py`) pops what it
says and executes it.

The rules (docs/batching.md): requests merge only when their shape keys are equal (the
non-ragged, non-batch shapes and which optional inputs they send); a batch closes at the
first request that doesn't fit, so queue order is kept; it ends at the largest preferred size
the queue fills exactly, else at what is there (up to max_batch_size). Under the `window`
policy a batch that could still grow and is not at a preferred size waits until the oldest
request has waited the delay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from inferd.scheduling.pending import BatchClose

__all__ = ["Formation", "FormationOptions", "Queued", "form_batch"]


class Queued(Protocol):
    """What formation reads of a queued request (`pending.Pending`)."""

    @property
    def rows(self) -> int: ...

    @property
    def shape_key(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def enqueued_ns(self) -> int: ...

    @property
    def deadline_ns(self) -> int | None: ...

    @property
    def live(self) -> bool:
        """Still waiting for an answer: not cancelled, not timed out."""
        ...


Q = TypeVar("Q", bound=Queued)


@dataclass(frozen=True, slots=True)
class FormationOptions:
    """The part of the batching options formation reads (`batcher.BatchingOptions`)."""

    max_batch_size: int  # 0: the model does not batch
    preferred_sizes: tuple[int, ...] = ()
    max_delay_s: float = 0.0
    policy: str = "work_conserving"  # or "window", "none"

    @property
    def batches(self) -> bool:
        return self.max_batch_size > 0 and self.policy != "none"


@dataclass(frozen=True, slots=True)
class Formation(Generic[Q]):
    """What leaves the queue now.

    The caller pops `taken` entries from the head of the queue: the `batch` to execute, the
    `expired` to fail with DEADLINE_EXCEEDED, and dead ones (cancelled) to drop. An empty
    batch with `wait_until_ns` set means a window is open: nothing leaves before then unless
    more arrives.
    """

    batch: list[Q]
    reason: BatchClose
    taken: int = 0
    expired: list[Q] = field(default_factory=list)
    wait_until_ns: int | None = None


def form_batch(queue: Iterable[Q], options: FormationOptions, now_ns: int) -> Formation[Q]:
    """The batch to execute now from `queue` (priority order), and why it closed."""
    expired: list[tuple[int, Q]] = []  # with their place in the queue
    batch: list[Q] = []
    ends: list[int] = []  # per batch entry: how many queue entries taking it pops
    rows: list[int] = []  # per batch entry: the batch's rows up to and including it
    limit = options.max_batch_size
    key: tuple[tuple[int, ...], ...] | None = None
    reason = BatchClose.QUEUE_EMPTY
    total = scanned = 0
    for scanned, entry in enumerate(queue, 1):
        if not entry.live:
            continue
        if entry.deadline_ns is not None and entry.deadline_ns <= now_ns:
            expired.append((scanned, entry))
            continue
        if not options.batches:
            return Formation([entry], BatchClose.FULL, scanned, [e for _, e in expired])
        if key is None:
            key = entry.shape_key
        elif entry.shape_key != key:
            reason = BatchClose.SHAPE_MISMATCH
            break
        if batch and total + entry.rows > limit:
            reason = BatchClose.FULL
            break
        total += entry.rows
        batch.append(entry)
        ends.append(scanned)
        rows.append(total)
        if total >= limit:
            reason = BatchClose.FULL
            break
    if not batch:  # everything scanned is dead or expired: pop it all
        return Formation([], BatchClose.QUEUE_EMPTY, scanned, [e for _, e in expired])
    if options.policy == "window" and reason is BatchClose.QUEUE_EMPTY:
        # Triton's window: a batch that could still grow (neither full, nor closed by a
        # request of other shapes) and is not at a preferred size waits until its oldest
        # request has waited the delay.
        window_ends_ns = batch[0].enqueued_ns + int(options.max_delay_s * 1e9)
        if total not in options.preferred_sizes and now_ns < window_ends_ns:
            return Formation([], reason, 0, [], window_ends_ns)
    size = len(batch)
    if reason is not BatchClose.FULL and options.preferred_sizes:
        # The largest preferred size the queue fills exactly (Triton's rule).
        best = max((i for i, r in enumerate(rows) if r in options.preferred_sizes), default=-1)
        if best >= 0:
            size, reason = best + 1, BatchClose.PREFERRED_SIZE
    if options.policy == "window" and reason is BatchClose.QUEUE_EMPTY:
        reason = BatchClose.MAX_DELAY
    end = ends[size - 1]
    return Formation(batch[:size], reason, end, [e for i, e in expired if i <= end])
