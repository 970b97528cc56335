"""Length grouping: batches of similar length for a model that pads (`pad_inputs`).

A padded batch costs what its longest member costs times its rows: a 60-token sentence in a
batch of 31 sentences of 8 makes the model compute about five times the tokens it was sent.
So, when an instance is free, the oldest queued request leaves (always: a long input never
waits behind more than the batches already executing), and with it the queued requests
nearest to it in length, among the next `group_window` looked at, for as long as the batch's
padding stays within `group_waste` of the elements its requests sent. A request that would
pad past that bound closes the batch (reason `length`) and waits for one of its own length.

As `formation.form_batch` (whose contract this keeps, docs/batching.md), it is a pure
function of the queue: no thread, loop or future, unit-tested in
tests/unit/scheduling/test_length_groups.py. Under the default policy a lone request leaves
at once; under `window`, a batch that could still grow waits until its oldest request has
waited the delay.
"""

from __future__ import annotations

from collections.abc import Iterable

from inferd.scheduling.formation import Formation, FormationOptions, Q
from inferd.scheduling.pending import BatchClose

__all__ = ["form_length_group"]


def form_length_group(queue: Iterable[Q], options: FormationOptions, now_ns: int) -> Formation[Q]:
    """The batch to execute now from `queue` (priority order): its oldest live request and
    those nearest to it in length; and why it closed."""
    expired: list[tuple[int, Q]] = []  # with how many entries popping them takes
    head: Q | None = None
    head_at = scanned = 0
    candidates: list[Q] = []
    looked, window = 0, options.group_window
    for scanned, entry in enumerate(queue, 1):
        if not entry.is_queued:
            continue
        deadline_ns = entry.deadline_ns
        if deadline_ns is not None and deadline_ns <= now_ns:
            expired.append((scanned, entry))
            continue
        if head is None:
            head, head_at, key = entry, scanned, entry.request.shape_key
            continue
        if entry.request.shape_key == key:  # other shapes wait to head a batch of their own
            candidates.append(entry)
        looked += 1
        if looked >= window:
            break
    if head is None:  # everything scanned was cancelled or expired: pop it all
        return Formation([], BatchClose.QUEUE_EMPTY, scanned, [e for _, e in expired])
    limit = options.max_batch_size
    length = head.request.length
    rows = head.request.rows
    real = length * rows  # elements in length units: the other dims are equal (shape key)
    longest = length
    bound = 1.0 + options.group_waste
    batch = [head]
    reason = BatchClose.FULL if rows >= limit else BatchClose.QUEUE_EMPTY
    if reason is BatchClose.QUEUE_EMPTY and candidates:
        candidates.sort(key=lambda e: abs(e.request.length - length))  # stable: oldest first
        for entry in candidates:
            request = entry.request
            if rows + request.rows > limit:  # too many rows: one with fewer may still fit
                reason = BatchClose.FULL
                continue
            grown = max(longest, request.length)
            grown_real = real + request.length * request.rows
            if grown * (rows + request.rows) > bound * grown_real:
                reason = BatchClose.LENGTH  # the rest are further from the head's length
                break
            batch.append(entry)
            rows += request.rows
            real, longest = grown_real, grown
            if rows >= limit:
                reason = BatchClose.FULL
                break
    taken_expired = [e for i, e in expired if i <= head_at]
    if options.policy == "window" and reason is BatchClose.QUEUE_EMPTY:
        window_ends_ns = head.enqueued_ns + int(options.max_delay_s * 1e9)
        if now_ns < window_ends_ns:
            return Formation([], reason, 0, [], window_ends_ns)
        reason = BatchClose.MAX_DELAY
    return Formation(batch, reason, head_at, taken_expired, scattered=len(batch) > 1)
