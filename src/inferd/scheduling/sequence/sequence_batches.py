"""Forming one instance's next batch from the sequences it holds, and keeping the state
outputs of a batch that executed. Pure functions over the sequence table's entries: the unit
tests call them without an event loop thread or a model.

Both strategies take at most one request per sequence into a batch (the head of its queue,
so a sequence's requests execute in order), and only requests whose tensors (inputs and
implicit state) have equal non-batch shapes, which is what merging them into one tensor needs.

- direct: row i of the batch is batch slot i. Slots without a ready request below the
  highest ready one get a filler row (Triton's null request: zeros, READY false, CORRID 0),
  so that a model keeping state per slot always sees a sequence at its own slot.
- oldest: the ready sequences whose head requests are oldest, up to max_batch_size, and the
  largest preferred_batch_size the ready ones fill.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from inferd.datatypes import V2_TO_NUMPY
from inferd.errors import ErrorKind, InferdError
from inferd.scheduling.pending import BatchClose, Pending, Result
from inferd.scheduling.sequence.sequence_config import SequenceOptions, StateSpec
from inferd.scheduling.sequence.sequence_table import SequenceEntry
from inferd.tensors.signature import BoundRequest
from inferd.types import SEQUENCE_START, Array

Key = tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


@dataclass(slots=True)
class FormedBatch:
    pendings: list[Pending]  # in row order
    entries: list[SequenceEntry | None]  # the sequence of each row; None for a filler
    reason: BatchClose


def live_head(entry: SequenceEntry) -> Pending | None:
    """The sequence's next request to execute, dropping those whose client went away."""
    queue = entry.queue
    while queue and queue[0].future.done():
        queue.popleft()
    return queue[0] if queue else None


def _state_in(
    opts: SequenceOptions, entry: SequenceEntry, request: BoundRequest
) -> dict[str, Array]:
    if entry.state is None or request.flags & SEQUENCE_START:
        return opts.initial_states()
    return entry.state


def _key(opts: SequenceOptions, entry: SequenceEntry, request: BoundRequest) -> Key:
    states = _state_in(opts, entry, request) if opts.states else {}
    return request.shape_key, tuple(
        a.shape[1:] if opts.batched else a.shape for a in states.values()
    )


def ready_heads(slots: list[SequenceEntry | None]) -> list[tuple[int, SequenceEntry, Pending]]:
    """(slot, sequence, head request) of every slot whose sequence has a request ready and
    is not executing one."""
    ready = []
    for slot, entry in enumerate(slots):
        if entry is None or entry.executing:
            continue
        head = live_head(entry)
        if head is not None:
            ready.append((slot, entry, head))
    return ready


def form_batch(
    opts: SequenceOptions,
    slots: list[SequenceEntry | None],
    filler_future: asyncio.Future[object],
    waited: bool = False,
) -> FormedBatch | None:
    """Take the next batch off the lane's slots, or None when no sequence has a request
    ready. The requests taken leave their queues, carrying the state the model gets with
    them (their control inputs were attached on arrival); their sequences are marked
    executing."""
    ready = ready_heads(slots)
    if not ready:
        return None
    if opts.strategy == "oldest":
        ready.sort(key=lambda item: item[2].enqueued_ns)
    _, first_entry, first = ready[0]
    key = _key(opts, first_entry, first.request)
    fits = [item for item in ready if _key(opts, item[1], item[2].request) == key]
    mismatch = len(fits) < len(ready)
    limit = opts.batch_rows
    fits = fits[:limit]
    reason = BatchClose.FULL if len(fits) == limit else BatchClose.QUEUE_EMPTY
    if mismatch and reason is not BatchClose.FULL:
        reason = BatchClose.SHAPE_MISMATCH
    if opts.strategy == "oldest" and opts.preferred_sizes and len(fits) < limit:
        best = max((s for s in opts.preferred_sizes if s <= len(fits)), default=0)
        if best:
            fits, reason = fits[:best], BatchClose.PREFERRED_SIZE
    if waited and reason is BatchClose.QUEUE_EMPTY:
        reason = BatchClose.MAX_DELAY
    template = first.request
    pendings: list[Pending] = []
    entries: list[SequenceEntry | None] = []
    if opts.strategy == "direct":
        by_slot = {slot: (entry, head) for slot, entry, head in fits}
        filler = None
        for slot in range(max(by_slot) + 1):
            if slot in by_slot:
                entry, head = by_slot[slot]
                pendings.append(_take(opts, entry, head))
                entries.append(entry)
            else:
                if filler is None:
                    filler = _filler(opts, template, first_entry, filler_future)
                pendings.append(filler)
                entries.append(None)
    else:
        for _, entry, head in fits:
            pendings.append(_take(opts, entry, head))
            entries.append(entry)
    return FormedBatch(pendings, entries, reason)


def attach_controls(opts: SequenceOptions, request: BoundRequest) -> None:
    """Add the request's control inputs (known when it arrives, unlike its state)."""
    if opts.has_controls:
        request.inputs = {
            **request.inputs,
            **opts.control_tensors(request.correlation_id, request.flags),
        }


def _take(opts: SequenceOptions, entry: SequenceEntry, head: Pending) -> Pending:
    entry.queue.popleft()
    entry.executing = True
    if opts.states:
        request = head.request
        request.inputs = {**request.inputs, **_state_in(opts, entry, request)}
    return head


def _filler(
    opts: SequenceOptions,
    template: BoundRequest,
    entry: SequenceEntry,
    future: asyncio.Future[object],
) -> Pending:
    """A not-ready row shaped like `template`: zeros, READY false, START/END false, CORRID 0."""
    inputs: dict[str, Array] = {}
    for name, array in template.inputs.items():
        if array.dtype.kind == "O":
            inputs[name] = np.full(array.shape, b"", dtype=object)
        else:
            inputs[name] = np.zeros_like(array)
    inputs.update(opts.control_tensors(0, 0, ready=False))
    for name, array in _state_in(opts, entry, template).items():
        inputs[name] = np.zeros_like(array)
    request = BoundRequest(inputs, 1, template.shape_key, [], "")
    return Pending(request, future, filler=True)  # type: ignore[arg-type]


def keep_states(
    opts: SequenceOptions,
    entries: list[SequenceEntry | None],
    results: list[Result],
    shared: bool,
) -> list[Result]:
    """Store each sequence's state outputs as its next state; a request whose model output
    lacks or misshapes a state fails alone (its sequence keeps its previous state).
    `shared`: the outputs are slices of one batch tensor, so the kept ones are copied (a
    slice would keep the whole batch's memory alive)."""
    if not opts.states:
        return results
    kept: list[Result] = []
    for entry, out in zip(entries, results, strict=True):
        if entry is None or isinstance(out, InferdError):
            kept.append(out)
            continue
        states: dict[str, Array] = {}
        problem = ""
        for spec in opts.states:
            array = out.get(spec.output_name)
            if array is None:
                problem = f"produced no state output '{spec.output_name}' (sequence_batching.state)"
                break
            checked = _checked_state(opts, spec, np.asarray(array))
            if isinstance(checked, str):
                problem = checked
                break
            states[spec.input_name] = checked.copy() if shared else checked
        if problem:
            kept.append(InferdError(ErrorKind.MODEL_ERROR, problem))
            continue
        entry.state = states
        kept.append(out)
    return kept


def _checked_state(opts: SequenceOptions, spec: StateSpec, array: Array) -> Array | str:
    want = V2_TO_NUMPY[spec.datatype]
    if array.dtype != want:
        if not np.can_cast(array.dtype, want, casting="same_kind"):
            return (
                f"state output '{spec.output_name}' is {array.dtype}, which does not convert "
                f"to the state's {spec.datatype}"
            )
        array = array.astype(want)
    inner = array.shape[1:] if opts.batched else array.shape
    if (opts.batched and (array.ndim == 0 or array.shape[0] != 1)) or not spec.matches(inner):
        lead = [1] if opts.batched else []
        return (
            f"state output '{spec.output_name}' has shape {list(array.shape)}, but the "
            f"state's dims are {lead + list(spec.dims)}"
        )
    return array
