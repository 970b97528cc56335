"""The merge step: one batch's requests become the model's input tensors.

Runs in the instance's worker thread (`run_batch.run_batch`) and in warm-up, so both feed a
model the same way. Inputs are concatenated along the batch dimension; a ragged input is
flattened and concatenated in one dimension instead, and the config's batch inputs are
computed from the requests' shapes (Triton's rules: docs/batching.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from inferd.config.padding_config import PaddingPlan, PadInput
from inferd.config.ragged_config import (
    ACCUMULATED_ELEMENT_COUNT_WITH_ZERO,
    ELEMENT_COUNT,
    ITEM_SHAPE,
    ITEM_SHAPE_FLATTEN,
    MAX_ELEMENT_COUNT_AS_SHAPE,
    BatchInputSpec,
    RaggedPlan,
)
from inferd.tensors.signature import BoundRequest
from inferd.types import Array


def merged_inputs(requests: Sequence[BoundRequest], plan: RaggedPlan) -> dict[str, Array]:
    """The model's inputs for `requests`, in order (their inner shapes agree, except for
    ragged inputs and padded inputs' padded dimension: the batcher merges only requests with
    equal shape keys)."""
    first = requests[0]
    if not plan.active:
        if len(requests) == 1:
            return first.inputs  # no copy for a lone request
        return {name: np.concatenate([r.inputs[name] for r in requests]) for name in first.inputs}
    inputs: dict[str, Array] = {}
    padding = plan.padding
    pads = {p.name: p for p in padding.inputs} if padding is not None else {}
    for name, array in first.inputs.items():
        pad = pads.get(name)
        if pad is not None and len(requests) > 1:
            inputs[name] = padded([r.inputs[name] for r in requests], pad)
        elif name in plan.ragged:
            # reshape(-1) is a view of a contiguous array: a lone request is not copied.
            parts = [r.inputs[name].reshape(-1) for r in requests]
            inputs[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        elif len(requests) == 1:
            inputs[name] = array
        else:
            inputs[name] = np.concatenate([r.inputs[name] for r in requests])
    for spec in plan.batch_inputs:
        value = batch_input(spec, [r.inputs[spec.source].shape for r in requests])
        for i, target in enumerate(spec.targets):
            # Each target its own array: a Python model may write into its inputs.
            inputs[target] = value if i == 0 else value.copy()
    return inputs


def padded(arrays: Sequence[Array], pad: PadInput) -> Array:
    """`arrays` (batch dimension first) as one batch, each padded with `pad.value` to the
    longest in `pad.axis`; no padding, and no copy beyond the concatenation, when they agree."""
    axis = pad.axis
    longest = max(a.shape[axis] for a in arrays)
    if all(a.shape[axis] == longest for a in arrays):
        return np.concatenate(arrays)
    first = arrays[0]
    shape = list(first.shape)
    shape[0] = sum(a.shape[0] for a in arrays)
    shape[axis] = longest
    out = np.full(shape, pad.value, dtype=first.dtype)
    where: list[slice] = [slice(None)] * first.ndim
    row = 0
    for a in arrays:
        where[0] = slice(row, row + a.shape[0])
        where[axis] = slice(0, a.shape[axis])
        out[tuple(where)] = a
        row += a.shape[0]
    return out


def padding_counts(requests: Sequence[BoundRequest], padding: PaddingPlan) -> tuple[int, int]:
    """Elements of the padded inputs that `requests` sent, and how many the model received
    once they were padded to the longest: the padding waste of their batch."""
    real = received = 0
    longest = max(r.length for r in requests)  # every padded input has the request's length
    for pad in padding.inputs:
        for r in requests:
            shape = r.inputs[pad.name].shape
            per = math.prod(s for k, s in enumerate(shape) if k != pad.axis)
            real += per * shape[pad.axis]
            received += per * longest
    return real, received


def batch_input(spec: BatchInputSpec, shapes: Sequence[tuple[int, ...]]) -> Array:
    """The batch input `spec` for requests whose `spec.source` inputs have `shapes` (batch
    dimension first). Element counts include the batch dimension, as Triton's do.

    A batch holds at most max_batch_size requests: plain Python over their shapes, then one
    array, costs less here than a chain of numpy calls on a handful of numbers."""
    kind = spec.kind
    if kind in (ITEM_SHAPE, ITEM_SHAPE_FLATTEN):
        # Each batch item's shape without the batch dimension; a request of n rows is n items.
        items = [s[1:] for s in shapes for _ in range(s[0])]
        value = np.array(items, dtype=spec.dtype)
        return value if kind == ITEM_SHAPE else value.reshape(-1)
    counts = [math.prod(s) for s in shapes]
    if kind == MAX_ELEMENT_COUNT_AS_SHAPE:
        # Only the shape carries information (Triton leaves the data uninitialised).
        return np.zeros(max(counts), dtype=spec.dtype)
    if kind == ELEMENT_COUNT:
        return np.array(counts, dtype=spec.dtype)
    ends = list(itertools.accumulate(counts))  # BATCH_ACCUMULATED_ELEMENT_COUNT(_WITH_ZERO)
    if kind == ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        ends.insert(0, 0)
    return np.array(ends, dtype=spec.dtype)
