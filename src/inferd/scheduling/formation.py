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


class Shaped(Protocol):
    """What formation reads of a request (`signature.BoundRequest`)."""

    @property
    def rows(self) -> int: ...

    @property
    def length(self) -> int:
        """Its padded dimension's size (models with `pad_inputs`; else 0)."""
        ...

    @property
    def shape_key(self) -> tuple[tuple[int, ...], ...]: ...


class Queued(Protocol):
    """What formation reads of a queued request (`pending.Pending`). Plain attributes, no
    properties: formation reads them for every queued request it scans."""

    @property
    def request(self) -> Shaped: ...

    @property
    def enqueued_ns(self) -> int: ...

    @property
    def deadline_ns(self) -> int | None: ...

    @property
    def is_queued(self) -> bool:
        """Still waiting: False once cancelled, timed out or taken."""
        ...


Q = TypeVar("Q", bound=Queued)


@dataclass(frozen=True, slots=True)
class FormationOptions:
    """The part of the batching options formation reads (`batcher.BatchingOptions`)."""

    max_batch_size: int  # 0: the model does not batch
    preferred_sizes: tuple[int, ...] = ()
    max_delay_s: float = 0.0
    policy: str = "work_conserving"  # or "window", "none"
    # Length grouping (models with `pad_inputs`, length_groups.py): the padding a batch may
    # carry, as a share of its real elements (negative: off, batches leave in queue order),
    # and how many queued requests are looked at for members of similar length.
    group_waste: float = -1.0
    group_window: int = 0

    @property
    def groups_lengths(self) -> bool:
        return self.group_waste >= 0 and self.batches

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
    # Members of `batch` may lie past the `taken` head of the queue (length grouping): the
    # caller takes them out of the queue's counts where they are.
    scattered: bool = False


def form_batch(queue: Iterable[Q], options: FormationOptions, now_ns: int) -> Formation[Q]:
    """The batch to execute now from `queue` (priority order), and why it closed."""
    expired: list[tuple[int, Q]] = []  # with how many entries popping them takes
    batch: list[Q] = []
    limit = options.max_batch_size
    preferred = options.preferred_sizes
    batches = options.batches
    key: tuple[tuple[int, ...], ...] | None = None
    reason = BatchClose.QUEUE_EMPTY
    total = scanned = end = 0
    best = best_end = 0  # the batch cut at the largest preferred size it fills exactly
    for scanned, entry in enumerate(queue, 1):
        if not entry.is_queued:
            continue
        deadline_ns = entry.deadline_ns
        if deadline_ns is not None and deadline_ns <= now_ns:
            expired.append((scanned, entry))
            continue
        request = entry.request
        if not batches:
            return Formation([entry], BatchClose.FULL, scanned, [e for _, e in expired])
        if key is None:
            key = request.shape_key
        elif request.shape_key != key:
            reason = BatchClose.SHAPE_MISMATCH
            break
        rows = request.rows
        if batch and total + rows > limit:
            reason = BatchClose.FULL
            break
        total += rows
        batch.append(entry)
        end = scanned
        if total >= limit:
            reason = BatchClose.FULL
            break
        if preferred and total in preferred:
            best, best_end = len(batch), scanned
    if not batch:  # everything scanned was cancelled or expired: pop it all
        return Formation([], BatchClose.QUEUE_EMPTY, scanned, [e for _, e in expired])
    if options.policy == "window" and reason is BatchClose.QUEUE_EMPTY:
        # Triton's window: a batch that could still grow (neither full, nor closed by a
        # request of other shapes) and is not at a preferred size waits until its oldest
        # request has waited the delay.
        window_ends_ns = batch[0].enqueued_ns + int(options.max_delay_s * 1e9)
        if total not in preferred and now_ns < window_ends_ns:
            return Formation([], reason, 0, [], window_ends_ns)
    if best and total < limit:  # also when the next request would overflow
        del batch[best:]
        end, reason = best_end, BatchClose.PREFERRED_SIZE
    elif options.policy == "window" and reason is BatchClose.QUEUE_EMPTY:
        reason = BatchClose.MAX_DELAY
    return Formation(batch, reason, end, [e for i, e in expired if i <= end] if expired else [])
