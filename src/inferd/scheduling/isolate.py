"""When a batched execution fails: find the request(s) the model fails on, answer the rest.

Requests from different clients share a batch; one client's input that makes the model raise
would otherwise fail every request of that batch (two bad requests among thirty good ones
failed 232 of 600 valid requests, issue #14). So a failed batch is bisected: each half is
executed again, a half that fails is split again, down to single requests. Only a failure
that persists for a request executed alone is that request's error; the others get their
answers. A batch of N requests costs at most 2N - 2 executions more, all in the same call
(for an in-process instance the execution timeout bounds them together; a worker process
times each of its executions). A model sees the requests of a failed batch again: side
effects of its own (a log it writes) happen again for them.

Who is at fault: when some requests of the batch succeed, the model demonstrably serves,
and the requests that fail alone fail with `RequestFailedAloneError` (500, the model raised), which
readiness (`unready_after_failures`) and the circuit breaker do not count. When every request
fails alone too, it is a failed execution, as in Triton: the circuit breaker counts it, and
readiness counts it towards its probe (readiness_probe.py).

Not bisected (failed as a whole, as before): a broken batch contract (outputs without the
batch's rows: the model's bug whatever the inputs), running out of memory (the batch is too
large for the instance, which smaller parts would hide: `inferd tune` and the failure
metrics must see it), sequence batches (re-running would advance
their state twice) and decoupled models (re-running would send responses again).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from inferd.backends.base import AnyInstance
from inferd.config.ragged_config import RaggedPlan
from inferd.errors import ErrorKind, InferdError
from inferd.scheduling.run_batch import ContractError, Timings, run_batch

if TYPE_CHECKING:
    from inferd.scheduling.pending import Pending, Result

log = logging.getLogger("inferd.scheduling")

# Errors that say the model failed on its input; any other kind (unloading, a worker
# process down) says nothing about the requests and is not worth re-running for.
_MODEL_KINDS = (ErrorKind.MODEL_ERROR, ErrorKind.INTERNAL)


class RequestFailedAloneError(InferdError):
    """The model failed on this request executed alone while others of its batch
    succeeded: the request's error, which readiness and the circuit breaker don't count."""


def can_isolate(batch: list[Pending]) -> bool:
    """Whether a failure of `batch` may be bisected (the caller excludes sequence batches)."""
    if len(batch) < 2:
        return False
    for p in batch:  # noqa: SIM110 (a generator's every step is a call: 32 per batch)
        if p.request.responses is not None:
            return False
    return True


def run_isolating(
    name: str,
    version: str,
    isolate: bool,
    instance: AnyInstance,
    batch: list[Pending],
    batched: bool,
    by_request: bool,
    with_info: bool,
    ragged: RaggedPlan,
) -> tuple[list[Result], Timings, int]:
    """`run_batch`, and on a model failure of a batch that may be bisected, the bisection;
    returns the per-request results, the summed timings and the extra executions."""
    try:
        results, timings = run_batch(instance, batch, batched, by_request, with_info, ragged)
    except Exception as exc:
        if not isolate or isinstance(exc, ContractError) or _out_of_memory(exc):
            raise
        if isinstance(exc, InferdError) and exc.kind not in _MODEL_KINDS:
            raise
        first = exc
    else:
        return results, timings, 0
    n = len(batch)
    answers: list[Result | None] = [None] * n
    total = [0, 0, 0]
    executions = alone = 0
    spans = [(n // 2, n), (0, n // 2)]  # a stack: the first half is executed first
    while spans:
        lo, hi = spans.pop()
        executions += 1
        try:
            got, times = run_batch(instance, batch[lo:hi], batched, by_request, with_info, ragged)
        except Exception as exc:
            if hi - lo > 1:
                mid = (lo + hi) // 2
                spans += [(mid, hi), (lo, mid)]
                continue
            error = exc if isinstance(exc, InferdError) else _model_error(exc)
            answers[lo] = RequestFailedAloneError(error.kind, error.message)
            alone += 1
            continue
        answers[lo:hi] = got
        for i, t in enumerate(times):
            total[i] += t
    if alone == n:  # it fails on every request: the model's failure, not the requests'
        raise first
    log.warning(
        "model %s version %s: a batch of %d requests failed (%s); executed in parts (%d "
        "executions more), %d request(s) fail alone and get the error, the others their "
        "answers",
        name,
        version,
        n,
        first,
        executions,
        alone,
        extra={"model": name},
    )
    return [a for a in answers if a is not None], (total[0], total[1], total[2]), executions


# What runtimes say when memory runs out, lowercased (as inferd_tools/tune/sweep.py reads
# them: the message reaches here, its exception type not always).
_OUT_OF_MEMORY = (
    "out of memory",  # CUDA, ROCm, MPS
    "outofmemory",
    "failed to allocate memory",  # onnxruntime
    "bad_alloc",
    "memoryerror",
    "unable to allocate",  # numpy
    "can't allocate memory",  # torch's CPU allocator
    "cannot allocate memory",  # ENOMEM
    "alloc_failed",  # cuBLAS / cuDNN
    "cudaerrormemoryallocation",
)


def _out_of_memory(exc: Exception) -> bool:
    if isinstance(exc, MemoryError):
        return True
    message = str(exc).lower()
    return any(pattern in message for pattern in _OUT_OF_MEMORY)


def _model_error(exc: Exception) -> InferdError:
    return InferdError(ErrorKind.MODEL_ERROR, str(exc))
