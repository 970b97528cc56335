"""What every scheduler shares once it has formed a batch: execute it off the event loop on
one instance, answer each request of it, and tell telemetry how it went.

The dynamic batcher (`batcher.py`) and the sequence batcher
(`scheduling/sequence/sequence_batcher.py`) differ in
how they form batches; `BatchRunner` is the part after that, so timings, statistics,
metrics and failure handling are the same for both.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from inferd.backends.base import (
    AnyInstance,
    ReplaceableInstance,
    RequestInfoInstance,
    RequestListInstance,
    SupervisedInstance,
)
from inferd.config.ragged_config import NO_RAGGED, RaggedPlan
from inferd.errors import ErrorKind, InferdError, deadline_exceeded
from inferd.events import BatchRecord, ExecutionTimes, Telemetry
from inferd.scheduling.instance_runs import InstanceRun, wake
from inferd.scheduling.isolate import RequestFailedAloneError, can_isolate, run_isolating
from inferd.scheduling.load_signal import LoadWindow
from inferd.scheduling.merge import padding_counts
from inferd.scheduling.pending import BatchClose, Finish, Pending, Result
from inferd.scheduling.readiness_probe import ReadinessProbe, run_probe
from inferd.scheduling.run_batch import Timings, unloading

log = logging.getLogger("inferd.scheduling")


class BatchObserver(Protocol):
    """Sees each batch that executed, on the event loop, after its requests are answered
    (drift monitoring: monitoring/drift_sampler.py). It must only hand the batch on: a
    queue put, no work on the arrays."""

    def on_executed(self, batch: Sequence[Pending], results: Sequence[Result]) -> None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class _Stuck:
    """An instance whose execution outlived the execution timeout."""

    returned: asyncio.Future[None]  # resolved once that execution returns
    replaceable: bool  # its worker process was killed: it is being replaced, not lost


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
        execution_timeout_s: float = 0.0,
        on_all_stuck: Callable[[], None] | None = None,
        readiness: ReadinessProbe | None = None,
    ) -> None:
        """`execution_timeout_s` (0: none): how long one execution may take before its
        requests fail with DEADLINE_EXCEEDED and its instance is taken out of service;
        `on_all_stuck` is called when that leaves no instance to serve; `readiness` counts
        failed executions and probes the model after a run of them (default: counts only)."""
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
        self.measured_at = 0.0  # monotonic time exec_s last took an execution in
        # Failed executions in a row, and the probe that says whose failures they are.
        self.readiness = readiness if readiness is not None else ReadinessProbe()
        self.executing = 0  # requests in batches that are executing now
        # Busy time and demand over a recent window: the autoscaling signal (load_signal.py).
        self.load = LoadWindow(len(self.instances))
        self._slot_of = {id(inst): i for i, inst in enumerate(self.instances)}
        self._executor = ThreadPoolExecutor(
            max_workers=len(self.instances), thread_name_prefix=f"inferd-{name}"
        )
        self.execution_timeout_s = execution_timeout_s
        self._on_all_stuck = on_all_stuck
        self._index = {id(inst): i for i, inst in enumerate(self.instances)}
        self._stuck: dict[int, _Stuck] = {}  # by id(instance)
        # Instances not stuck in an execution that cannot be ended (in-process models): 0
        # means nothing can serve until one returns, and readiness says so.
        self.serving = len(self.instances)
        self._closed = False
        self.observer: BatchObserver | None = None  # set once, after load (drift)

    def instances_alive(self) -> bool:
        """False while an instance's worker process is dead (crash isolation)."""
        return all(
            inst.is_alive() for inst in self.instances if isinstance(inst, SupervisedInstance)
        )

    def unhealthy_instances(self) -> int:
        """Instances that cannot execute now: stuck past the execution timeout, or with
        their worker process dead or restarting."""
        down = sum(
            1
            for inst in self.instances
            if id(inst) not in self._stuck
            and isinstance(inst, SupervisedInstance)
            and not inst.is_alive()
        )
        return len(self._stuck) + down

    def out_of_service(self, instance: AnyInstance) -> bool:
        """The instance is stuck in an execution nothing can end: it serves again only if
        that execution ever returns."""
        stuck = self._stuck.get(id(instance))
        return stuck is not None and not stuck.replaceable

    def returned(self, instance: AnyInstance) -> asyncio.Future[None] | None:
        """While the instance is stuck past the execution timeout: a future resolved once
        its execution returns (await it shielded). None when it is not stuck."""
        stuck = self._stuck.get(id(instance))
        return None if stuck is None else stuck.returned

    def release(self, instance: AnyInstance, to_pool: Callable[[AnyInstance], None]) -> None:
        """Give an instance that `execute` returned back to the scheduler's pool: at once,
        or, when it is stuck, once its execution returns (never, if it never does)."""
        stuck = self._stuck.get(id(instance))
        if stuck is None:
            to_pool(instance)
        else:
            stuck.returned.add_done_callback(lambda _: to_pool(instance))

    async def execute(
        self,
        instance: AnyInstance,
        batch: list[Pending],
        reason: BatchClose,
        finish: Finish | None = None,
    ) -> bool:
        """Execute `batch` on `instance` and answer its requests; True if it executed.

        The caller owns `instance` and, when this returns, gives it back with `release`:
        an execution past the execution timeout is answered with DEADLINE_EXCEEDED at the
        timeout, but its instance stays out of the pool until the call returns.
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
        failed, timed_out = True, False
        extra = 0  # executions more than one: a failed batch bisected (isolate.py)
        call: InstanceRun[tuple[list[Result], Timings, int]] = InstanceRun(
            loop, (self.name, self.version, self._index[id(instance)])
        )
        try:
            self._executor.submit(
                call.run,
                run_isolating,
                self.name,
                self.version,
                finish is None and can_isolate(batch),  # never a sequence batch
                instance,
                batch,
                self.batched,
                self._takes_request_lists,
                self._takes_request_info,
                self.ragged,
            )
        except RuntimeError:  # the executor is shut down: the version is unloading
            call.run(unloading, self.name)
        try:
            if not await self._returns_in_time(instance, call):
                timed_out = True
                self.readiness.streak += 1  # counted; no probe on a stuck instance
                self._time_out(instance, call, batch)
                return False
            results, timings, extra = call.result()
        except Exception as exc:
            if isinstance(exc, InferdError):
                error = InferdError(exc.kind, f"model '{self.name}': {exc.message}")
            else:
                error = InferdError(ErrorKind.MODEL_ERROR, f"model '{self.name}': {exc}")
            probe = self.readiness.failed_execution(not self._closed, time.monotonic())
            if probe is not None:  # before the answers: readiness is decided when they leave
                await self._probe(instance, probe)
            self._fail(batch, error)
        else:
            failed = False
            exec_s = sum(timings) / 1e9
            self.exec_s = exec_s if self.exec_s is None else 0.8 * self.exec_s + 0.2 * exec_s
            self.measured_at = now = time.monotonic()
            readiness = self.readiness
            readiness.streak = 0
            readiness.failure = ""
            if finish is not None:
                results = finish(batch, results)
            for p, out in zip(batch, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(out, InferdError):  # one request of the batch failed alone
                    kind = type(out) if isinstance(out, RequestFailedAloneError) else InferdError
                    p.future.set_exception(kind(out.kind, f"model '{self.name}': {out.message}"))
                else:
                    times = ExecutionTimes(
                        dequeued_ns - p.enqueued_ns, *timings, rows, requests, dequeued_ns
                    )
                    p.future.set_result((out, times))
            if now >= readiness.keep_after:  # at most once a minute
                readiness.keep(batch, results, now)
            if self.observer is not None:
                self.observer.on_executed(batch, results)
        finally:
            self.executing -= requests
            self.load.finished(slot, dequeued_ns, time.perf_counter_ns(), rows)
            padding = self.ragged.padding
            real, padded = (
                padding_counts([p.request for p in batch], padding)
                if padding is not None and batch
                else (0, 0)
            )
            self._telemetry.batch(
                BatchRecord(
                    self.name,
                    self.version,
                    rows,
                    requests,
                    reason.value,
                    *timings,
                    failed,
                    timed_out,
                    extra,
                    real,
                    padded,
                )
            )
        return not failed

    @property
    def consecutive_failures(self) -> int:
        """Executions in a row that failed since one succeeded or a probe passed."""
        return self.readiness.streak

    async def _probe(self, instance: AnyInstance, probe: Pending) -> None:
        """Execute readiness's probe on `instance`, which has just failed an execution, and
        record what it says (readiness_probe.py). Bounded by the execution timeout as an
        execution is; it is no request's, so nothing counts it but the probe's metric."""
        readiness = self.readiness
        call: InstanceRun[None] = InstanceRun(
            asyncio.get_running_loop(), (self.name, self.version, self._index[id(instance)])
        )
        try:
            self._executor.submit(
                call.run,
                run_probe,
                instance,
                probe,
                self.batched,
                self._takes_request_lists,
                self._takes_request_info,
                self.ragged,
            )
        except RuntimeError:  # the executor is shut down: the version is unloading
            return
        error = ""
        if not await self._returns_in_time(instance, call):
            self._time_out(instance, call, [])
            error = "it did not finish within the execution timeout"
        else:
            try:
                call.result()
            except Exception as exc:
                error = str(exc) or type(exc).__name__
        last, what = readiness.last(), readiness.what()
        readiness.probed(error)
        if error:
            log.error(
                "model %s version %s: %s failed, and so did %s when executed again to "
                "check it (%s): the model is not ready until an execution succeeds",
                self.name,
                self.version,
                last,
                what,
                error,
                extra={"model": self.name, "event": "readiness_probe"},
            )
        else:
            log.warning(
                "model %s version %s: %s failed, but %s succeeded when executed again: "
                "the failures are their inputs', the model stays ready",
                self.name,
                self.version,
                last,
                what,
                extra={"model": self.name, "event": "readiness_probe"},
            )

    async def _returns_in_time(self, instance: AnyInstance, call: InstanceRun[Any]) -> bool:
        """Wait for `call`, up to the execution timeout; False if it is still running then.

        The thread cannot be stopped, and the instance must stay out of the pool until it
        is done with it, so the wait ends, not the call. Time a process-isolated instance
        spends waiting for its worker to (re)start is not execution: it does not count.
        """
        timeout = self.execution_timeout_s
        if not timeout:
            await call.woken
            return True
        loop = asyncio.get_running_loop()
        while True:
            timer = loop.call_later(timeout, wake, call.woken)
            try:
                await call.woken
            finally:
                timer.cancel()
            if call.returned:
                return True
            if not isinstance(instance, ReplaceableInstance):
                return False
            started = instance.execution_started
            if started is not None:
                # (A time from before this call: it has not reached its worker yet.)
                started = max(started, call.started)
                timeout = started + self.execution_timeout_s - time.monotonic()
                if timeout <= 0:
                    return False
            # else: still waiting for its worker process; the clock has not started
            call.woken = loop.create_future()

    def _time_out(
        self, instance: AnyInstance, call: InstanceRun[Any], batch: list[Pending]
    ) -> None:
        """The execution outlived the timeout: answer its requests now, take the instance
        out of the pool until the call returns, and replace its worker process if it has
        one (a thread cannot be killed; a process can)."""
        replaceable = isinstance(instance, ReplaceableInstance)
        timeout_ms = round(self.execution_timeout_s * 1000)
        index = self._index[id(instance)]
        if replaceable:
            what = "its worker process is being replaced"
        else:
            what = "the instance is out of service until the execution returns"
        message = (
            f"model '{self.name}' version {self.version}: the execution did not finish "
            f"within the model's execution timeout of {timeout_ms} ms "
            f"(execution_timeout_ms); {what}"
        )
        stuck = _Stuck(asyncio.get_running_loop().create_future(), replaceable)
        self._stuck[id(instance)] = stuck
        if not replaceable:
            self.serving -= 1
        log.error(
            "model %s version %s: instance %d has executed for longer than its execution "
            "timeout of %d ms; %s (%d of %d instances still serving)",
            self.name,
            self.version,
            index,
            timeout_ms,
            what,
            self.serving,
            len(self.instances),
            extra={"model": self.name},
        )
        self._fail(batch, deadline_exceeded(message))
        call.on_return = lambda: self._returned(instance, stuck)
        if isinstance(instance, ReplaceableInstance):
            instance.kill_process(f"an execution passed the timeout of {timeout_ms} ms")
        if self.serving == 0 and self._on_all_stuck is not None:
            self._on_all_stuck()

    def _returned(self, instance: AnyInstance, stuck: _Stuck) -> None:
        """A stuck execution returned (on the loop): the instance serves again; what it
        returned or raised is dropped (its requests were answered at the timeout)."""
        del self._stuck[id(instance)]
        if not stuck.replaceable:
            self.serving += 1
        log.warning(
            "model %s version %s: instance %d's execution that passed the timeout returned; "
            "the instance is back in service",
            self.name,
            self.version,
            self._index[id(instance)],
            extra={"model": self.name},
        )
        stuck.returned.set_result(None)
        if self._closed:  # unloaded while it was stuck: release it now
            threading.Thread(target=self._close_instance, args=(instance,), daemon=True).start()

    @staticmethod
    def _fail(batch: list[Pending], exc: InferdError) -> None:
        for p in batch:
            if not p.future.done():
                p.future.set_exception(exc)

    def close(self) -> None:
        """Release the threads and the instances; nothing executes afterwards. An instance
        stuck in an execution is released if and when that execution returns."""
        self._closed = True
        if self.observer is not None:
            self.observer.close()
        self._executor.shutdown(wait=not self._stuck)
        for inst in self.instances:
            if id(inst) not in self._stuck:
                self._close_instance(inst)

    def _close_instance(self, instance: AnyInstance) -> None:
        try:
            instance.close()
        except Exception:
            log.exception("model %s: closing an instance failed", self.name)
