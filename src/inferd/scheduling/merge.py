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
    ragged inputs: the batcher merges only requests with equal shape keys)."""
    first = requests[0]
    if not plan.active:
        if len(requests) == 1:
            return first.inputs  # no copy for a lone request
        return {name: np.concatenate([r.inputs[name] for r in requests]) for name in first.inputs}
    inputs: dict[str, Array] = {}
    for name, array in first.inputs.items():
        if name in plan.ragged:
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
