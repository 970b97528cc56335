"""What every scheduler shares once it has formed a batch: execute it off the event loop on
one instance, answer each request of it, and tell telemetry how it went.

The dynamic batcher (`batcher.py`) and the sequence batcher (`sequence_batcher.py`) differ in
how they form batches; `BatchRunner` is the part after that, so timings, statistics,
metrics and failure handling are the same for both.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

from inferd.backends.base import (
    AnyInstance,
    Instance,
    RequestInfoInstance,
    RequestListInstance,
    SupervisedInstance,
)
from inferd.errors import ErrorKind, InferdError
from inferd.events import BatchRecord, ExecutionTimes, Telemetry
from inferd.python_model import RequestInfo
from inferd.repository.ragged_config import NO_RAGGED, RaggedPlan
from inferd.scheduling.load_signal import LoadWindow
from inferd.scheduling.merge import merged_inputs
from inferd.signature import BoundRequest
from inferd.types import Array

log = logging.getLogger("inferd.scheduling")


class BatchClose(enum.Enum):
    """Why a batch left the queue: the answer to "why doesn't it batch?"."""

    FULL = "full"
    PREFERRED_SIZE = "preferred_size"
    MAX_DELAY = "max_delay"
    SHAPE_MISMATCH = "shape_mismatch"
    QUEUE_EMPTY = "queue_empty"


Outcome = tuple[dict[str, Array], ExecutionTimes]


@dataclass(slots=True, eq=False)
class Pending:
    request: BoundRequest
    future: asyncio.Future[Outcome]
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    is_queued: bool = True  # its rows count in the batcher's queued_rows
    # A row the sequence batcher adds to keep other sequences in their batch slots (Triton's
    # null request): executed, never answered, never counted.
    filler: bool = False


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """What one execution did; kept for tests and statistics."""

    batch_size: int  # rows
    requests: int
    reason: BatchClose


Result = dict[str, Array] | InferdError
# Called on the event loop with a batch's per-request results, before they are answered; it
# returns the results to answer with (the sequence batcher keeps each sequence's state here).
Finish = Callable[[list[Pending], list[Result]], list[Result]]


class BatchRunner:
    """Executes batches on a model version's instances, one thread per instance."""

    def __init__(
        self,
        name: str,
        version: str,
        instances: Sequence[AnyInstance],
        batched: bool,
        telemetry: Telemetry,
        ragged: RaggedPlan = NO_RAGGED,
    ) -> None:
        self.name = name
        self.version = version
        self.instances = list(instances)
        self.batched = batched  # max_batch_size > 0: inputs carry the batch dimension
        self.ragged = ragged  # ragged inputs and batch inputs the merge step builds
        self._telemetry = telemetry
        # Decided once: a runtime protocol check costs microseconds on every batch.
        self._takes_request_lists = all(
            isinstance(inst, RequestListInstance) for inst in self.instances
        )
        self._takes_request_info = not self._takes_request_lists and all(
            isinstance(inst, RequestInfoInstance) and inst.wants_request_info
            for inst in self.instances
        )
        self.exec_s: float | None = None  # moving average of a batch's execution time
        self.consecutive_failures = 0  # executions in a row that failed (readiness)
        self.executing = 0  # requests in batches that are executing now
        self.executions: deque[ExecutionRecord] = deque(maxlen=10_000)
        # Busy time and demand over a recent window: the autoscaling signal (load_signal.py).
        self.load = LoadWindow(len(self.instances))
        self._slot_of = {id(inst): i for i, inst in enumerate(self.instances)}
        self._executor = ThreadPoolExecutor(
            max_workers=len(self.instances), thread_name_prefix=f"inferd-{name}"
        )

    def instances_alive(self) -> bool:
        """False while an instance's worker process is dead (crash isolation)."""
        return all(
            inst.is_alive() for inst in self.instances if isinstance(inst, SupervisedInstance)
        )

    async def execute(
        self,
        instance: AnyInstance,
        batch: list[Pending],
        reason: BatchClose,
        finish: Finish | None = None,
    ) -> bool:
        """Execute `batch` on `instance` and answer its requests; True if it executed.

        The caller owns `instance` and gets it back when this returns.
        """
        loop = asyncio.get_running_loop()
        requests = rows = 0
        for p in batch:
            if not p.filler:
                requests += 1
                rows += p.request.rows
        self.executing += requests
        dequeued_ns = time.perf_counter_ns()
        slot = self._slot_of[id(instance)]
        self.load.started(slot, dequeued_ns)
        timings = (0, 0, 0)
        failed = True
        try:
            results, timings = await loop.run_in_executor(
                self._executor,
                run_batch,
                instance,
                batch,
                self.batched,
                self._takes_request_lists,
                self._takes_request_info,
                self.ragged,
            )
        except InferdError as exc:
            self._fail(batch, InferdError(exc.kind, f"model '{self.name}': {exc.message}"))
        except Exception as exc:
            self._fail(batch, InferdError(ErrorKind.MODEL_ERROR, f"model '{self.name}': {exc}"))
        else:
            failed = False
            exec_s = sum(timings) / 1e9
            self.exec_s = exec_s if self.exec_s is None else 0.8 * self.exec_s + 0.2 * exec_s
            if finish is not None:
                results = finish(batch, results)
            for p, out in zip(batch, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(out, InferdError):  # one request of the batch failed alone
                    p.future.set_exception(
                        InferdError(out.kind, f"model '{self.name}': {out.message}")
                    )
                else:
                    times = ExecutionTimes(dequeued_ns - p.enqueued_ns, *timings, rows, requests)
                    p.future.set_result((out, times))
        finally:
            self.consecutive_failures = self.consecutive_failures + 1 if failed else 0
            self.executing -= requests
            self.load.finished(slot, dequeued_ns, time.perf_counter_ns(), rows)
            self.executions.append(ExecutionRecord(rows, requests, reason))
            self._telemetry.batch(
                BatchRecord(self.name, self.version, rows, requests, reason.value, *timings, failed)
            )
        return not failed

    @staticmethod
    def _fail(batch: list[Pending], exc: InferdError) -> None:
        for p in batch:
            if not p.future.done():
                p.future.set_exception(exc)

    def close(self) -> None:
        """Release the threads and the instances; nothing executes afterwards."""
        self._executor.shutdown(wait=True)
        for inst in self.instances:
            try:
                inst.close()
            except Exception:
                log.exception("model %s: closing an instance failed", self.name)


Timings = tuple[int, int, int]  # compute input (merge), infer, output (split), in ns


def run_batch(
    instance: AnyInstance,
    batch: list[Pending],
    batched: bool,
    by_request: bool,
    with_info: bool = False,
    ragged: RaggedPlan = NO_RAGGED,
) -> tuple[list[Result], Timings]:
    """Merge, execute, split: runs in the instance's worker thread, never on the loop."""
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
            raise InferdError(
                ErrorKind.MODEL_ERROR,
                f"execute() returned {len(results)} responses for {len(batch)} requests; "
                "it must return one response per request",
            )
        return results, (0, clock() - started, 0)
    t0 = clock()
    inputs = merged_inputs([p.request for p in batch], ragged)
    t1 = clock()
    if with_info:
        infos = [RequestInfo.of(p.request) for p in batch]
        outputs = cast(RequestInfoInstance, instance).execute_with_info(inputs, infos)
    else:
        outputs = cast(Instance, instance).execute(inputs)
    t2 = clock()
    if not batched:
        return [outputs], (t1 - t0, t2 - t1, clock() - t2)
    total = sum(p.request.rows for p in batch)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise InferdError(
                ErrorKind.MODEL_ERROR,
                f"output '{name}' has batch size {array.shape[0] if array.ndim else 0} "
                f"for a batch of {total} rows; a model must keep the batch dimension",
            )
    if len(batch) == 1:
        return [outputs], (t1 - t0, t2 - t1, clock() - t2)
    split: list[Result] = []
    offset = 0
    for p in batch:
        end = offset + p.request.rows
        split.append({name: array[offset:end] for name, array in outputs.items()})
        offset = end
    return split, (t1 - t0, t2 - t1, clock() - t2)
