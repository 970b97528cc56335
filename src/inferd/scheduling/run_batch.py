"""One execution of a formed batch, in the instance's worker thread: merge the requests'
inputs, execute, split the outputs back per request (`execution.BatchRunner` hands it over;
`isolate.py` re-runs parts of a batch that failed)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NoReturn, cast

from inferd.backends.base import AnyInstance, Instance, RequestInfoInstance, RequestListInstance
from inferd.backends.executing import EXECUTING
from inferd.config.ragged_config import NO_RAGGED, RaggedPlan
from inferd.errors import ErrorKind, InferdError
from inferd.scheduling.merge import merged_inputs
from inferd.types import Array

if TYPE_CHECKING:
    from inferd.scheduling.pending import Pending, Result

Timings = tuple[int, int, int]  # compute input (merge), infer, output (split), in ns


class ContractError(InferdError):
    """The model broke the batch contract (outputs without the batch's rows, a response
    count that is not the request count): a bug of the model, whatever its inputs, which
    re-running parts of the batch would only hide (isolate.py does not)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.MODEL_ERROR, message)


def unloading(name: str) -> NoReturn:
    raise InferdError(ErrorKind.UNAVAILABLE, f"model '{name}' is unloading")


def run_batch(
    instance: AnyInstance,
    batch: list[Pending],
    batched: bool,
    by_request: bool,
    with_info: bool = False,
    ragged: RaggedPlan = NO_RAGGED,
) -> tuple[list[Result], Timings]:
    """Merge, execute, split: runs in the instance's worker thread, never on the loop.
    Calls the model makes meanwhile to other models (BLS) are made for the batch's requests:
    they carry their deadline and trace, and end when their clients give up
    (backends/python/bls_request.py)."""
    token = EXECUTING.set(batch)
    try:
        return _run_batch(instance, batch, batched, by_request, with_info, ragged)
    finally:
        EXECUTING.reset(token)


def _run_batch(
    instance: AnyInstance,
    batch: list[Pending],
    batched: bool,
    by_request: bool,
    with_info: bool,
    ragged: RaggedPlan,
) -> tuple[list[Result], Timings]:
    clock = time.perf_counter_ns
    if by_request:
        # Models written against Triton's execute(requests) contract see the requests
        # separately, and answer each one (or fail it alone); ragged inputs keep each
        # request's own shape, as in Triton's Python backend. A request's future is done once
        # its client gave up (cancelled, deadline passed): request.is_cancelled() reads it.
        for p in batch:
            p.request.is_cancelled = p.future.done
        started = clock()
        results = cast(RequestListInstance, instance).execute_requests([p.request for p in batch])
        if len(results) != len(batch):
            raise ContractError(
                f"execute() returned {len(results)} responses for {len(batch)} requests; "
                "it must return one response per request",
            )
        return results, (0, clock() - started, 0)
    t0 = clock()
    inputs = merged_inputs([p.request for p in batch], ragged)
    t1 = clock()
    if with_info:
        requests = [p.request for p in batch]
        outputs = cast(RequestInfoInstance, instance).execute_with_requests(inputs, requests)
    else:
        outputs = cast(Instance, instance).execute(inputs)
    t2 = clock()
    if not batched:
        return [outputs], (t1 - t0, t2 - t1, clock() - t2)
    total = sum(p.request.rows for p in batch)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ContractError(
                f"output '{name}' has batch size {array.shape[0] if array.ndim else 0} "
                f"for a batch of {total} rows; a model must keep the batch dimension",
            )
    if len(batch) == 1:
        return [outputs], (t1 - t0, t2 - t1, clock() - t2)
    cuts = ragged.padding.outputs if ragged.padding is not None else None
    if cuts:
        return _split_cut(batch, outputs, cuts), (t1 - t0, t2 - t1, clock() - t2)
    split: list[Result] = []
    offset = 0
    for p in batch:
        end = offset + p.request.rows
        split.append({name: array[offset:end] for name, array in outputs.items()})
        offset = end
    return split, (t1 - t0, t2 - t1, clock() - t2)


def _split_cut(
    batch: list[Pending], outputs: dict[str, Array], cuts: dict[str, int]
) -> list[Result]:
    """The split of a padded batch: outputs in `cuts` (name -> axis) carry the padded
    dimension, and each request gets them cut back to its own length."""
    longest = max(p.request.length for p in batch)
    for name, axis in cuts.items():
        array = outputs.get(name)
        if array is not None and (array.ndim <= axis or array.shape[axis] != longest):
            size = array.shape[axis] if array.ndim > axis else "nothing"
            raise ContractError(
                f"output '{name}' holds {size} in dimension {axis}, the padded one "
                f"(padded_outputs), for a batch padded to {longest}"
            )
    split: list[Result] = []
    offset = 0
    for p in batch:
        end = offset + p.request.rows
        mine = {name: array[offset:end] for name, array in outputs.items()}
        length = p.request.length
        for name, axis in cuts.items():
            if name in mine and length != longest:
                where = [slice(None)] * mine[name].ndim
                where[axis] = slice(0, length)
                mine[name] = mine[name][tuple(where)]
        split.append(mine)
        offset = end
    return split
