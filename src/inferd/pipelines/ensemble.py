"""Running a Triton ensemble: each step is a request to its composing model through the same
steps a client's request takes (the server's `StepCaller`: dataplane/internal_requests.py),
so that model's routing, admission, batching, statistics, metrics and request log apply per step.

A request's tensors live in one dict of numpy arrays (ensemble input, intermediate and output
tensors alike, by their ensemble names): a step's inputs are views of it and its outputs go
back into it; nothing is encoded between steps. Each step starts as soon as every tensor it
reads exists (dataflow, as Triton: a slow step delays only the steps that read its outputs),
independent steps concurrently in one TaskGroup, and only the steps the requested outputs need.

Deadlines: the ensemble's deadline (the client's, or its `timeout` parameter, whichever comes
first) is every step's deadline, so a step gets what is left. Cancelling the ensemble's task
(the client went away) cancels its running steps; steps not started never run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from inferd.errors import ErrorKind, InferdError, deadline_exceeded
from inferd.events import CallContext, ExecutionTimes, StepTiming
from inferd.pipelines.ensemble_config import EnsembleGraph, Step
from inferd.scheduling.load_signal import LoadSample
from inferd.scheduling.pending import Outcome
from inferd.telemetry.tracing import span_header, start_trace
from inferd.tensors.signature import BoundRequest
from inferd.types import Array, InferRequest, InferResponse, RequestedOutput, Tensor


class StepCaller(Protocol):
    """What an ensemble needs of the server: one step's request answered as a client's unary
    request would be (the DataPlane's internal calls, dataplane/internal_requests.py)."""

    async def call_model(self, request: InferRequest, parent: CallContext) -> InferResponse: ...


# A step's NOT_FOUND (its model was unloaded a moment ago) is the ensemble's UNAVAILABLE:
# the ensemble exists, one of its parts cannot serve.
_STEP_KIND = {ErrorKind.NOT_FOUND: ErrorKind.UNAVAILABLE}


@dataclass(slots=True)
class EnsembleRun:
    """One request's pass through the graph: its tensors and its steps' timings."""

    tensors: dict[str, Array]
    datatypes: dict[str, str]
    steps: list[StepTiming] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)  # each step request's


class Ensemble:
    """An ensemble version's scheduler: it has no queue or instances of its own (its steps'
    models do), so the Scheduler protocol's numbers are its requests in flight and zeros."""

    def __init__(self, graph: EnsembleGraph, version: str, datatypes: dict[str, str]) -> None:
        self.graph = graph
        self.name = graph.name
        self.version = version
        self.input_datatypes = datatypes  # ensemble input -> its v2 datatype
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False
        # needed steps -> (their running order, whether they form a chain); one entry per
        # set of requested outputs a client used, so a few
        self._plans: dict[frozenset[int], tuple[list[Step], bool]] = {}

    async def run(
        self,
        calls: StepCaller,
        bound: BoundRequest,
        ctx: CallContext,
        priority: int,
        timeout_us: int,
        steps: list[StepTiming],
    ) -> Outcome:
        """The requested outputs of `bound` (the ensemble's checked request); each step's
        timing is appended to `steps`. The request's `priority` and its own parameters go
        to every step (as Triton's ensembles do): each composing model queues it at that
        level, and a Python model sees the parameters."""
        started = time.perf_counter_ns()
        deadline = ctx.deadline_ns
        if timeout_us:
            own = started + timeout_us * 1000
            deadline = own if deadline is None else min(deadline, own)
        # The steps' context: the ensemble's deadline; as trace parent the ensemble's span
        # (a request without a traceparent gets one of the server's: its span is the root),
        # so each step's span nests under it; and the ensemble's request as their caller.
        start_trace(ctx)
        parent = replace(
            ctx, deadline_ns=deadline, traceparent=span_header(ctx), trace_root=False, caller=ctx
        )
        run = EnsembleRun(dict(bound.inputs), dict(self.input_datatypes), steps)
        run.parameters.update(bound.parameters)  # the client's own (not Triton's reserved)
        if priority:
            run.parameters["priority"] = priority
        needed = self.graph.needed_steps(bound.output_names)
        self._inflight += 1
        self._idle.clear()
        try:
            plan = self._plans.get(needed)
            if plan is None:
                plan = self._plans[needed] = (
                    self.graph.in_order(needed),
                    self.graph.is_chain(needed),
                )
            order, is_chain = plan
            if is_chain:  # one ready step at a time: no tasks needed
                for step in order:
                    await self._step(calls, step, run, parent, bound.request_id)
            else:
                await self._dataflow(calls, order, run, parent, bound.request_id)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        outputs = {name: run.tensors[name] for name in bound.output_names}
        elapsed = time.perf_counter_ns() - started
        times = ExecutionTimes(compute_infer_ns=elapsed, batch_rows=bound.rows, batch_requests=1)
        return outputs, times

    async def _dataflow(
        self, calls: StepCaller, steps: list[Step], run: EnsembleRun, parent: CallContext, rid: str
    ) -> None:
        """Run `steps` as Triton does: each starts the moment every tensor it reads exists
        (a step that finishes starts the steps it unblocked), not when a whole wave is done.
        The first failure cancels the running steps and is the error (the step's own, status
        and all, not a group of them); the steps not started never run."""
        graph = self.graph
        blockers = {s.number: len(graph.depends_on[s.number]) for s in steps}
        dependents: dict[int, list[Step]] = {s.number: [] for s in steps}
        for s in steps:
            for number in graph.depends_on[s.number]:
                dependents[number].append(s)

        async def node(group: asyncio.TaskGroup, step: Step) -> None:
            await self._step(calls, step, run, parent, rid)
            # Started from inside this still-running task, so the group is open for them.
            for after in dependents[step.number]:
                blockers[after.number] -= 1
                if not blockers[after.number]:
                    group.create_task(node(group, after))

        try:
            async with asyncio.TaskGroup() as group:
                for step in steps:
                    if not blockers[step.number]:
                        group.create_task(node(group, step))
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None

    async def _step(
        self, calls: StepCaller, step: Step, run: EnsembleRun, parent: CallContext, rid: str
    ) -> None:
        deadline = parent.deadline_ns
        if deadline is not None and time.perf_counter_ns() >= deadline:
            raise deadline_exceeded(
                f"ensemble '{self.name}' {step.label}: the request's deadline passed before "
                "the step could start"
            )
        tensors = run.tensors
        inputs = []
        for model_input, tensor in step.input_map.items():
            data = tensors[tensor]
            inputs.append(Tensor(model_input, run.datatypes[tensor], data.shape, data))
        request = InferRequest(
            model_name=step.model,
            model_version=step.version,
            inputs=inputs,
            id=rid,
            outputs=[RequestedOutput(name) for name in step.output_map],
            parameters=dict(run.parameters) if run.parameters else {},
        )
        started = time.perf_counter_ns()
        try:
            response = await calls.call_model(request, parent)
        except InferdError as exc:
            raise InferdError(
                _STEP_KIND.get(exc.kind, exc.kind),
                f"ensemble '{self.name}' {step.label}: {exc.message}",
            ) from None
        finally:
            run.steps.append(StepTiming(step.number, step.model, time.perf_counter_ns() - started))
        output_map = step.output_map
        for out in response.outputs:
            tensor = output_map[out.name]
            tensors[tensor] = out.data
            run.datatypes[tensor] = out.datatype

    # -- the Scheduler protocol -------------------------------------------------------------

    def readiness_problem(self) -> str:
        return ""  # its steps' models answer for their own failures

    async def submit(
        self,
        request: BoundRequest,
        priority: int = 0,
        timeout_us: int = 0,
        deadline_ns: int | None = None,
    ) -> Outcome:
        raise InferdError(
            ErrorKind.UNSUPPORTED, f"ensemble '{self.name}' runs through its steps (run)"
        )

    def queue_depth(self) -> int:
        return 0

    def load_sample(self) -> LoadSample:
        return LoadSample(0, 0, 0)

    def inflight(self) -> int:
        return self._inflight

    def refuses_all(self) -> bool:
        return self._stopped

    def instances_alive(self) -> bool:
        return True

    def serving_instances(self) -> int:
        return 1

    def unhealthy_instances(self) -> int:
        return 0

    async def stop(self) -> None:
        """Take no more requests; wait for those running (their steps drain in their own
        models' schedulers)."""
        self._stopped = True
        await self._idle.wait()
