"""The scheduler of a sequence model (Triton's sequence batcher, docs/sequences.md).

One "lane" per instance: a task that waits (on an event, never polling) until a sequence
bound to its instance has a request ready, forms a batch (`sequence_batches.form_batch`),
executes it through the shared `BatchRunner` and keeps the state outputs, then frees the
slots of sequences that ended. A sequence's requests execute in arrival order because it is
bound to one lane and each batch takes at most its head request. Idle sequences are released
by a timer on the event loop, set for the next expiry only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferd.backends.base import AnyInstance
from inferd.errors import ErrorKind, InferdError, deadline_exceeded, invalid, unavailable
from inferd.events import Telemetry
from inferd.scheduling.execution import BatchObserver, BatchRunner
from inferd.scheduling.load_signal import LoadSample
from inferd.scheduling.pending import Outcome, Pending, Result
from inferd.scheduling.readiness_probe import ReadinessProbe
from inferd.scheduling.sequence.sequence_batches import (
    FormedBatch,
    attach_controls,
    form_batch,
    keep_states,
    ready_heads,
)
from inferd.scheduling.sequence.sequence_config import SequenceOptions
from inferd.scheduling.sequence.sequence_table import UNLOAD, SequenceEntry, SequenceTable
from inferd.tensors.signature import BoundRequest

log = logging.getLogger("inferd.scheduling")


@dataclass(eq=False)
class _Lane:
    index: int
    instance: AnyInstance
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    busy: bool = False  # executing a batch now


class SequenceBatcher:
    """Owns a sequence model version's sequences and instances; `submit` as DynamicBatcher."""

    def __init__(
        self,
        name: str,
        instances: Sequence[AnyInstance],
        options: SequenceOptions,
        version: str = "",
        telemetry: Telemetry | None = None,
        execution_timeout_s: float = 0.0,
        unready_after_failures: int = 0,
    ) -> None:
        """`unready_after_failures` (0: never): readiness turns false after that many failed
        executions in a row. No probe tells a sequence model's failures from its inputs':
        executing a request again would advance its sequence's state (readiness_probe.py)."""
        self.name = name
        self.version = version
        self.options = options
        self._runner = BatchRunner(
            name,
            version,
            instances,
            options.batched,
            telemetry or Telemetry(),
            execution_timeout_s=execution_timeout_s,
            readiness=ReadinessProbe(unready_after_failures),
        )
        self.table = SequenceTable(
            name, len(self._runner.instances), options.slots, options.idle_s, time.monotonic
        )
        loop = asyncio.get_running_loop()
        self._filler_future: asyncio.Future[object] = loop.create_future()
        self._filler_future.cancel()  # fillers are never answered
        self._lanes = [_Lane(i, inst) for i, inst in enumerate(self._runner.instances)]
        self._reaper: asyncio.TimerHandle | None = None
        self._stopping = False
        self._progress = asyncio.Event()  # set after every batch: stop() waits on it
        self._tasks = [loop.create_task(self._run_lane(lane)) for lane in self._lanes]

    # -- what the data plane, metrics and readiness read ---------------------------------

    @property
    def consecutive_failures(self) -> int:
        return self._runner.readiness.streak

    def readiness_problem(self) -> str:
        return self._runner.readiness.problem()

    def load_sample(self) -> LoadSample:
        """Busy time and demand of the instances over the recent window (autoscaling)."""
        return self._runner.load.sample()

    def queue_depth(self) -> int:
        """Requests waiting for a batch (their sequences' queues)."""
        return sum(len(entry.queue) for entry in self.table.by_id.values())

    def inflight(self) -> int:
        return self.queue_depth() + self._runner.executing

    def refuses_all(self) -> bool:
        return False  # sequence batching has no queue limits to shed at

    def instances_alive(self) -> bool:
        return self._runner.instances_alive()

    def serving_instances(self) -> int:
        return self._runner.serving

    def unhealthy_instances(self) -> int:
        return self._runner.unhealthy_instances()

    def active_sequences(self) -> int:
        return self.table.active()

    def backlog(self) -> int:
        return len(self.table.backlog)

    def released(self) -> dict[str, int]:
        """Sequences released so far, by reason (`end`, `idle`)."""
        return dict(self.table.released)

    # -- submitting -------------------------------------------------------------------------

    async def submit(
        self,
        request: BoundRequest,
        priority: int = 0,
        timeout_us: int = 0,
        deadline_ns: int | None = None,
    ) -> Outcome:
        """Queue the request on its sequence; its outputs once its batch has executed.

        The request's `correlation_id` and `flags` say which sequence it belongs to; one
        that names no live sequence (and does not start one) is refused at once.
        """
        if self._stopping:
            raise unavailable(f"model '{self.name}' is unloading")
        self._runner.load.arrived(request.rows)  # demand, whether it is served or not
        for key, value in (("priority", priority), ("timeout", timeout_us)):
            if value:
                raise invalid(
                    f"request parameter '{key}' is not supported by model '{self.name}' "
                    "(sequence_batching has no queue policy)"
                )
        cid = request.correlation_id
        if isinstance(cid, bool) or cid in (0, ""):
            raise invalid(
                f"inference request to model '{self.name}' must specify a non-zero or "
                "non-empty correlation ID: it is a sequence model (send sequence_id)"
            )
        if self.options.batched and request.rows != 1:
            raise invalid(
                f"inference request to model '{self.name}' must specify batch-size 1 due "
                f"to requirements of sequence batcher (got {request.rows})"
            )
        if problem := self.options.id_problem(cid):
            raise invalid(f"request parameter 'sequence_id': model '{self.name}' {problem}")
        now = time.perf_counter_ns()
        remaining_s = None
        if deadline_ns is not None:
            remaining_s = (deadline_ns - now) / 1e9
            if remaining_s <= 0:
                raise deadline_exceeded(f"model '{self.name}': the request's deadline passed")
        attach_controls(self.options, request)
        entry = self.table.admit(request)
        if entry.has_slot and self._runner.out_of_service(self._lanes[entry.lane].instance):
            self._dropped(entry)
            raise unavailable(self._stuck_message(entry.lane))
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        pending = Pending(request, future, now)
        entry.queue.append(pending)
        if entry.has_slot:
            self._lanes[entry.lane].wake.set()
        try:
            if remaining_s is None:
                return await future
            async with asyncio.timeout(remaining_s):
                return await future
        except TimeoutError:
            self._dropped(entry)
            raise deadline_exceeded(
                f"model '{self.name}': the request's deadline passed while it was "
                f"{'executing' if entry.executing else 'queued'}"
            ) from None
        except asyncio.CancelledError:
            self._dropped(entry)  # the client went away; its request never executes
            raise

    def _dropped(self, entry: SequenceEntry) -> None:
        self._wake_taker(self.table.step_done(entry, time.monotonic()))
        self._arm_reaper()
        self._progress.set()

    # -- the lanes --------------------------------------------------------------------------

    async def _run_lane(self, lane: _Lane) -> None:
        slots = self.table.lanes[lane.index]
        opts = self.options
        while True:
            batch = None
            try:
                if not ready_heads(slots):
                    lane.wake.clear()
                    await lane.wake.wait()
                    continue
                waited = False
                if opts.max_delay_s > 0 and (
                    opts.strategy == "oldest" or opts.min_slot_utilization
                ):
                    waited = await self._wait_window(lane, slots)
                batch = form_batch(opts, slots, self._filler_future, waited)
                if batch is None:
                    continue
                lane.busy = True
                try:
                    await self._execute(lane, batch)
                finally:
                    lane.busy = False
                    self._progress.set()
                returned = self._runner.returned(lane.instance)
                if returned is not None:  # stuck past the execution timeout
                    if self._runner.out_of_service(lane.instance):
                        # Its sequences cannot advance: answer what they queued.
                        self._fail_lane(slots, None, unavailable(self._stuck_message(lane.index)))
                    await asyncio.shield(returned)
            except Exception:
                # A bug here must not leave requests waiting forever: answer them.
                log.exception("model %s: the sequence batcher failed", self.name)
                self._fail_lane(slots, batch)

    def _stuck_message(self, lane: int) -> str:
        return (
            f"model '{self.name}' version {self.version}: the instance holding this sequence "
            f"(instance {lane}) is stuck in an execution past the model's execution timeout; "
            "retry later"
        )

    def _fail_lane(
        self,
        slots: list[SequenceEntry | None],
        batch: FormedBatch | None,
        error: InferdError | None = None,
    ) -> None:
        error = error or InferdError(
            ErrorKind.INTERNAL, f"model '{self.name}': the sequence batcher failed; see the log"
        )
        pendings = list(batch.pendings) if batch is not None else []
        for entry in slots:
            if entry is not None:
                pendings.extend(entry.queue)
                entry.queue.clear()
                entry.executing = False
        for p in pendings:
            if not p.future.done():
                p.future.set_exception(error)
        now = time.monotonic()
        for entry in list(slots):
            if entry is not None:
                self._wake_taker(self.table.step_done(entry, now))
        self._progress.set()

    async def _wait_window(self, lane: _Lane, slots: list[SequenceEntry | None]) -> bool:
        """Wait for more sequences to be ready, until the batch is worth leaving or the
        oldest ready request has waited max_queue_delay; True if the delay ran out."""
        opts = self.options
        while True:
            ready = ready_heads(slots)
            if not ready:
                return False
            count = len(ready)
            occupied = sum(1 for entry in slots if entry is not None)
            if opts.strategy == "direct":
                if count / opts.slots >= opts.min_slot_utilization:
                    return False
            elif (
                count >= opts.batch_rows
                or count in opts.preferred_sizes
                or (count == occupied and occupied == opts.slots)  # nobody else can join
            ):
                return False
            oldest_ns = min(head.enqueued_ns for _, _, head in ready)
            remaining = (oldest_ns + int(opts.max_delay_s * 1e9) - time.perf_counter_ns()) / 1e9
            if remaining <= 0:
                return True
            lane.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await lane.wake.wait()

    async def _execute(self, lane: _Lane, batch: FormedBatch) -> None:
        opts = self.options
        shared = len(batch.pendings) > 1

        def finish(_: list[Pending], results: list[Result]) -> list[Result]:
            return keep_states(opts, batch.entries, results, shared)

        try:
            await self._runner.execute(lane.instance, batch.pendings, batch.reason, finish)
        finally:
            now = time.monotonic()
            for entry in batch.entries:
                if entry is not None:
                    entry.executing = False
                    self._wake_taker(self.table.step_done(entry, now))
            self._arm_reaper()

    def _wake_taker(self, taker: SequenceEntry | None) -> None:
        """A backlogged sequence took a freed slot: its lane has work."""
        if taker is not None and taker.has_slot:
            self._lanes[taker.lane].wake.set()

    # -- idle expiry ------------------------------------------------------------------------

    def _arm_reaper(self) -> None:
        if self._reaper is not None:
            return
        expiry = self.table.next_expiry()
        if expiry is None:
            return
        delay = max(0.0, expiry - time.monotonic())
        self._reaper = asyncio.get_running_loop().call_later(delay, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        for taker in self.table.expire(time.monotonic()):
            self._wake_taker(taker)
        self._arm_reaper()

    # -- shutdown ---------------------------------------------------------------------------

    def observe(self, observer: BatchObserver) -> None:
        """Hand each executed batch to `observer` too (drift monitoring)."""
        self._runner.observer = observer

    async def stop(self) -> None:
        """Finish what is queued and executing, then release the instances."""
        self._stopping = True
        while True:
            # No request can join an idle sequence now: release those at once, so that
            # backlogged sequences get their slots without waiting for the idle expiry.
            for taker in self.table.expire(math.inf, UNLOAD):
                self._wake_taker(taker)
            if not self._live_queued() and not any(lane.busy for lane in self._lanes):
                break
            self._progress.clear()
            await self._progress.wait()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._runner.close()

    def _live_queued(self) -> bool:
        return any(not p.future.done() for entry in self.table.by_id.values() for p in entry.queue)
