"""Per-model scheduler: a queue, a dynamic batcher and N instances executing off the loop.

Policies (see docs/batching.md):
- ``work_conserving`` (default): when an instance is idle a batch leaves at once with whatever
  is queued, so a lone request never waits for company; while every instance is busy, arrivals
  accumulate and leave together as the next batch (up to max_batch_size / preferred sizes).
- ``window``: Triton's strict window; a batch waits until it is full, reaches a preferred size,
  or its oldest request has waited ``max_queue_delay_microseconds``.
- ``none``: every request executes alone.

Which requests leave together is `formation.form_batch`, a pure function of the queue
(`length_groups.form_length_group` for a model that pads and groups by length);
admission (queue limits, priorities, deadlines) is `admission.py`; executing a batch on an
instance is `execution.BatchRunner`. This module ties them to the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from inferd.backends.base import AnyInstance
from inferd.config.ragged_config import NO_RAGGED, RaggedPlan
from inferd.errors import deadline_exceeded, unavailable
from inferd.events import ExecutionTimes, Telemetry
from inferd.scheduling.admission import admit, full, refuse_unmeetable_deadline, unconditional
from inferd.scheduling.execution import BatchObserver, BatchRunner
from inferd.scheduling.formation import Formation, FormationOptions, form_batch
from inferd.scheduling.length_groups import form_length_group
from inferd.scheduling.load_signal import LoadSample
from inferd.scheduling.pending import BatchClose, Pending
from inferd.scheduling.queues import PriorityQueues, QueuePolicy
from inferd.scheduling.readiness_probe import ReadinessProbe
from inferd.tensors.signature import BoundRequest
from inferd.types import Array

# An idle model's execution estimate older than this (or ten executions) is measured again
# before it refuses a deadline (DynamicBatcher._estimate_stale).
STALE_ESTIMATE_S = 1.0

__all__ = ["BatchClose", "BatchingOptions", "DynamicBatcher", "Pending"]


@dataclass(frozen=True, slots=True)
class BatchingOptions(FormationOptions):
    # Admission (Triton's queue policy): one entry per priority level, level 1 first.
    queue_policies: tuple[QueuePolicy, ...] = (QueuePolicy(),)
    default_priority: int = 0  # the level (0-based) of a request that names none


class DynamicBatcher:
    """Owns a model version's queue and instances.

    `submit` takes a bound request and returns its outputs once its batch has executed. The
    batcher owns the request from `submit` until the future resolves; a caller that cancels
    its await leaves a cancelled future behind, which the batcher skips.
    """

    def __init__(
        self,
        name: str,
        instances: Sequence[AnyInstance],
        options: BatchingOptions,
        version: str = "",
        telemetry: Telemetry | None = None,
        ragged: RaggedPlan = NO_RAGGED,
        execution_timeout_s: float = 0.0,
        unready_after_failures: int = 0,
        probe_sample: BoundRequest | None = None,
    ):
        """`unready_after_failures` (0: never) and `probe_sample` (the warm-up sample the
        model took, or None): readiness's rule on failed executions (readiness_probe.py)."""
        self.name = name
        self.version = version
        self._runner = BatchRunner(
            name,
            version,
            instances,
            options.max_batch_size > 0,
            telemetry or Telemetry(),
            ragged,
            execution_timeout_s,
            on_all_stuck=self._fail_queued,
            readiness=ReadinessProbe(unready_after_failures, probe_sample, keeps=True),
        )
        self._instances = self._runner.instances
        self._opts = options
        # Which queued requests leave together: in queue order, or grouped by length.
        self._form = form_length_group if options.groups_lengths else form_batch
        self._all_bounded = all(p.max_queue_size for p in options.queue_policies)
        self._unconditional = unconditional(options.queue_policies, options.default_priority)
        self._queue: PriorityQueues[Pending] = PriorityQueues(len(options.queue_policies))
        self._queued_rows = 0
        self._arrived = asyncio.Event()
        self._idle: asyncio.Queue[AnyInstance] = asyncio.Queue()
        for inst in self._instances:
            self._idle.put_nowait(inst)
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._loop_task = asyncio.get_running_loop().create_task(self._dispatch_loop())

    @property
    def batches(self) -> bool:
        return self._opts.batches

    @property
    def consecutive_failures(self) -> int:
        """Executions in a row that failed since one succeeded or a probe passed."""
        return self._runner.readiness.streak

    @property
    def readiness(self) -> ReadinessProbe:
        """Failed executions in a row and the probes' verdicts (readiness, metrics)."""
        return self._runner.readiness

    def readiness_problem(self) -> str:
        """Why its failed executions make the model unready, or ""."""
        return self._runner.readiness.problem()

    def inflight(self) -> int:
        """Requests queued or executing."""
        return self._queue.waiting_total + self._runner.executing

    def refuses_all(self) -> bool:
        """Every priority level's queue is bounded and full: any request would be shed."""
        if not self._all_bounded:
            return False  # the default (unbounded queues), checked on every request
        return full(self._opts.queue_policies, self._queue.waiting)

    def instances_alive(self) -> bool:
        """False while an instance's worker process is dead (crash isolation)."""
        return self._runner.instances_alive()

    def serving_instances(self) -> int:
        """Instances not stuck in an execution past the execution timeout."""
        return self._runner.serving

    def unhealthy_instances(self) -> int:
        return self._runner.unhealthy_instances()

    def queue_depth(self) -> int:
        """Requests waiting for a batch (not those cancelled or expired while queued)."""
        return self._queue.waiting_total

    def load_sample(self) -> LoadSample:
        """Busy time and demand of the instances over the recent window (autoscaling)."""
        return self._runner.load.sample()

    def _estimate_stale(self) -> bool:
        """The execution estimate deadline-aware admission refuses by is out of date: the
        model is idle and has not executed for a while. An estimate that refuses every
        request would never be measured again (a model that got fast again would refuse its
        clients for ever, one that got slow would look as fast as it last was); so such a
        request is let through, and its execution measures the model (at most one per
        STALE_ESTIMATE_S, or ten executions' time)."""
        runner = self._runner
        exec_s = runner.exec_s
        return (
            exec_s is not None
            and runner.executing == 0
            and self._queue.waiting_total == 0
            and time.monotonic() - runner.measured_at > max(STALE_ESTIMATE_S, 10 * exec_s)
        )

    async def submit(
        self,
        request: BoundRequest,
        priority: int = 0,
        timeout_us: int = 0,
        deadline_ns: int | None = None,
    ) -> tuple[dict[str, Array], ExecutionTimes]:
        """The request's outputs, and how its batch went, once the batch has executed.

        `priority` is Triton's level (1 = highest, 0 = the model's default); `timeout_us` the
        request's own queue timeout (used if the level's policy allows an override);
        `deadline_ns` (perf_counter_ns) the client's own deadline. Refuses at once, with
        RESOURCE_EXHAUSTED, when the level's queue is full or when the queued work ahead
        cannot finish before the deadline, and with INVALID_ARGUMENT when the deadline is
        shorter than one execution; fails with DEADLINE_EXCEEDED when the deadline passes
        first. A request removed this way never executes.
        """
        if self._stopping:
            raise unavailable(f"model '{self.name}' is unloading")
        now = time.perf_counter_ns()  # the load window's clock too
        self._runner.load.arrived(request.rows, now)  # demand, whether it is served or shed
        if not self._runner.serving:
            raise unavailable(self._all_stuck_message())
        opts = self._opts
        admitted = self._unconditional
        if admitted is None or priority or timeout_us or deadline_ns is not None:
            admitted = admit(
                self.name,
                opts.queue_policies,
                opts.default_priority,
                self._queue.waiting,
                priority,
                timeout_us,
                deadline_ns,
                now,
            )
        remaining_s = admitted.remaining_s
        if remaining_s is not None and not self._estimate_stale():
            refuse_unmeetable_deadline(
                self.name, self._runner.exec_s, self.estimated_wait_s(request.rows), remaining_s
            )
        future: asyncio.Future[tuple[dict[str, Array], ExecutionTimes]] = (
            asyncio.get_running_loop().create_future()
        )
        pending = Pending(
            request, future, now, deadline_ns=admitted.deadline_ns, level=admitted.level
        )
        self._queue.append(pending, admitted.level)
        self._queued_rows += request.rows
        self._arrived.set()
        try:
            if remaining_s is None:
                return await future
            async with asyncio.timeout(remaining_s):
                return await future
        except TimeoutError:
            where = "queued" if pending.is_queued else "executing"
            self._unqueue(pending)
            raise deadline_exceeded(
                f"model '{self.name}': the request's deadline passed while it was {where}"
            ) from None
        except asyncio.CancelledError:
            # The client went away: it stops counting now (queue depth, limits, rows); the
            # entry itself is skipped (never executed) when the batcher reaches it.
            self._unqueue(pending)
            raise

    def estimated_wait_s(self, rows: int) -> float | None:
        """How long a request arriving now would take to be answered, from the queued work
        and recent execution times; None until an execution has been timed."""
        exec_s = self._runner.exec_s
        if exec_s is None:
            return None
        per_batch = self._opts.max_batch_size if self.batches else 1
        batches = math.ceil((self._queued_rows + rows) / per_batch)
        rounds = math.ceil(batches / len(self._instances))
        busy = self._idle.empty()  # every instance is executing: the next frees up later
        return (rounds + (0.5 if busy else 0.0)) * exec_s

    def _unqueue(self, pending: Pending) -> None:
        if pending.is_queued:
            pending.is_queued = False
            self._queued_rows -= pending.request.rows
            self._queue.left(pending.level)

    def _all_stuck_message(self) -> str:
        return (
            f"model '{self.name}' version {self.version}: every instance is stuck in an "
            "execution past the model's execution timeout; retry later or elsewhere"
        )

    def _fail_queued(self) -> None:
        """No instance is left to serve (all stuck): answer what waits instead of letting it
        wait for an execution that may never return."""
        error = unavailable(self._all_stuck_message())
        while self._queue:
            p = self._queue.popleft()
            self._unqueue(p)
            if not p.future.done():
                p.future.set_exception(error)

    def observe(self, observer: BatchObserver) -> None:
        """Hand each executed batch to `observer` too (drift monitoring)."""
        self._runner.observer = observer

    async def stop(self) -> None:
        """Finish what is queued and executing, then release the instances."""
        self._stopping = True
        while self._queue or self._running:
            await asyncio.sleep(0.001)
        self._loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task
        self._runner.close()

    # -- dispatch -------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            instance = await self._idle.get()
            formed = self._form(self._queue, self._opts, time.perf_counter_ns())
            while formed.wait_until_ns is not None:  # a window is open (policy `window`)
                await self._wait_arrival(formed.wait_until_ns)
                formed = self._form(self._queue, self._opts, time.perf_counter_ns())
            batch = self._take(formed)
            if not batch:
                self._idle.put_nowait(instance)
                continue
            task = asyncio.get_running_loop().create_task(
                self._execute(instance, batch, formed.reason)
            )
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _wait_arrival(self, until_ns: int) -> None:
        """Until another request arrives, or `until_ns` (perf_counter_ns)."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, (until_ns - time.perf_counter_ns()) / 1e9)):
                await self._arrived.wait()

    def _take(self, formed: Formation[Pending]) -> list[Pending]:
        """Pop what `formed` took off the queue; fail its expired requests."""
        for _ in range(formed.taken):
            self._unqueue(self._queue.popleft())
        if formed.scattered:  # members further down the queue leave its counts now
            for p in formed.batch:
                self._unqueue(p)
        for p in formed.expired:
            if not p.future.done():
                p.future.set_exception(
                    deadline_exceeded(
                        f"model '{self.name}': the request's deadline passed while it was queued"
                    )
                )
        # A request cancelled this very loop turn has its future cancelled before its
        # submit() leaves the queue's counts: it is not executed either.
        return [p for p in formed.batch if not p.future.done()]

    async def _execute(
        self, instance: AnyInstance, batch: list[Pending], reason: BatchClose
    ) -> None:
        try:
            await self._runner.execute(instance, batch, reason)
        finally:
            self._runner.release(instance, self._idle.put_nowait)
