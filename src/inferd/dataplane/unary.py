"""The DataPlane's unary inference, in explicit steps the adapters call in order:

    with dataplane.start(model, version, ctx) as call:   # counted in flight; told to telemetry
        dataplane.admit(call)                              # before the body is read
        request = <the adapter decodes its wire message>   # failing: raise await
                                                           #   dataplane.refusal(call, exc)
        response = dataplane.respond(call, await dataplane.infer(call, request))
        <the adapter encodes `response`>

Everything between `start` and the end of the `with` (the adapter's decoding and encoding
too: a malformed body, a response past --max-response-mib) is counted as one request under
the model it was sent to, failures included.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from inferd.dataplane.cache_step import run_cached, stale_answer
from inferd.dataplane.capture import Capture
from inferd.dataplane.decoupled import unary_to_decoupled
from inferd.dataplane.decoupled_request import MODEL_FAILURES
from inferd.dataplane.internal_requests import InternalCalls
from inferd.dataplane.request_gate import RequestGate
from inferd.dataplane.shm_regions import SharedMemoryRegistry
from inferd.dataplane.unary_request import InferCall
from inferd.errors import ErrorKind, InferdError, shed, unavailable
from inferd.events import CallContext, ExecutionTimes, RequestRecord
from inferd.limits import response_too_large
from inferd.reliability.degrade.controller import Degradation, Route
from inferd.reliability.degrade.tiers import Tier
from inferd.repository.model_state import Model, ModelVersion
from inferd.repository.registry import ModelRegistry
from inferd.scheduling.admission import scheduling_parameters
from inferd.scheduling.isolate import RequestFailedAloneError
from inferd.scheduling.sequence.sequence_parameters import sequence_parameters
from inferd.tensors import classification
from inferd.tensors.conformance import OutputMismatchError, conform_output
from inferd.tensors.request_parameters import degradation_allowed
from inferd.tensors.signature import BoundRequest
from inferd.types import Array, InferRequest, InferResponse, Tensor, min_wire_bytes

if TYPE_CHECKING:
    from inferd.cache.response_cache import ResponseCache


class SignatureChecks(Protocol):
    """Whose signature checks a request may carry (`--engine`'s model table,
    engine/model_table.py): the generation it was checked against is the version's now."""

    def is_current(self, mv: ModelVersion, generation: int) -> bool: ...


class UnarySteps:
    """The unary steps of every request, from `start` to `respond` (the module's docstring
    shows their order). The DataPlane builds one and binds its steps as its own."""

    def __init__(
        self,
        registry: ModelRegistry,
        gate: RequestGate,
        shared_memory: SharedMemoryRegistry,
        capture: Capture,
        internal: InternalCalls,
        response_cache: ResponseCache | None = None,
        checked_signatures: SignatureChecks | None = None,
        max_response_bytes: int = 0,
    ) -> None:
        self.registry = registry
        self.gate = gate
        self.shared_memory = shared_memory
        self.capture = capture
        self.internal = internal  # ensembles' steps go through the DataPlane's steps again
        self.response_cache = response_cache  # --cache-config (docs/cache.md)
        # The engine's model table of `--workers N --engine` (engine/model_table.py): whose
        # front ends' signature checks a request may carry; None in one process.
        self.checked_signatures = checked_signatures
        # Responses past it fail with PAYLOAD_TOO_LARGE (0: none).
        self.max_response_bytes = max_response_bytes

    def start(self, model_name: str, version: str, ctx: CallContext) -> InferCall:
        """A request begins: counted in flight (and against --max-inflight-requests) until
        the end of its `with`, which tells telemetry how it went."""
        return InferCall(self.gate, model_name, version, ctx)

    def admit(self, call: InferCall) -> None:
        """The checks before a request's body is read (a shed request is refused unread)."""
        if self.admit_version(call.model_name, call.version, call.ctx, call.record).decoupled:
            raise unary_to_decoupled(call.model_name, call.ctx)

    async def refusal(self, call: InferCall, exc: InferdError) -> InferdError:
        """`exc` itself: in one process admission ran before the body was read. (A front end
        of `--engine` asks the engine's admission first: engine/engine_client.py.)"""
        return exc

    async def infer(self, call: InferCall, request: InferRequest) -> InferResponse:
        """Check, schedule and answer an admitted request: its degradation tier and its
        circuit decide whether it runs, is answered lighter, fails fast or goes to the
        fallback model."""
        record, ctx, model_name = call.record, call.ctx, call.model_name
        record.request = request
        record.request_id = request.id
        model = self.registry.models[model_name]
        circuit = model.circuit
        route, degradable = Route.PRIMARY, True
        degrade = model.degrade
        tier = degrade.current if degrade is not None else None
        if tier is not None:  # the model is degraded (docs/reliability.md)
            assert degrade is not None
            degradable = degradation_allowed(request)
            if tier.stale and degradable and self.response_cache is not None:
                stale = await self._stale(model_name, call.version, request, ctx, record, tier)
                if stale is not None:
                    if record.degraded_action == "stale":  # not a fresh hit
                        degrade.count(tier.number, "stale")
                    return stale
                # The lookup awaited: the tier may have moved, the model been reloaded.
                degrade = model.degrade
                tier = degrade.current if degrade is not None else None
        if tier is not None:
            assert degrade is not None
            # An opted-out request takes no share (the shares stay exact for the others),
            # but may be a probe: it goes to the model either way.
            if degradable or tier.all_away:
                route = degrade.route(time.monotonic())
            if route is Route.FALLBACK and degradable and self._ready(tier, degrade):
                degrade.count(tier.number, "fallback")
                record.degraded_tier, record.degraded_action = tier.number, "fallback"
                response = await self._serve(
                    degrade.policy.fallback_model, "", request, ctx, record, model_name
                )
                return _degraded(response, tier.number, "fallback")
        try:
            if not circuit.allow(probe=route is Route.PROBE or route is Route.TRIAL):
                return await self._circuit_open(model, request, ctx, record, tier)
            try:
                response = await self._serve(model_name, call.version, request, ctx, record)
            except InferdError as exc:
                # Failing alone in a batch that succeeded is the request's fault (isolate.py).
                alone = isinstance(exc, RequestFailedAloneError)
                circuit.record(False, counts=exc.kind in MODEL_FAILURES and not alone)
                raise
            except BaseException:
                circuit.record(False, counts=False)
                raise
            circuit.record(True)
            return response
        finally:
            if route is Route.PROBE:
                assert degrade is not None
                degrade.probe_done(time.monotonic())

    async def _circuit_open(
        self,
        model: Model,
        request: InferRequest,
        ctx: CallContext,
        record: RequestRecord,
        tier: Tier | None,
    ) -> InferResponse:
        """A request the circuit stops: to the fallback model, or refused (503)."""
        circuit, name = model.circuit, model.name
        held = bool(circuit.held) and tier is not None and tier.open_circuit
        fallback = circuit.policy.fallback_model or (
            model.degrade.policy.fallback_model if held and model.degrade else ""
        )
        if held:
            assert tier is not None and model.degrade is not None
            if fallback and degradation_allowed(request) and self._up(fallback):
                model.degrade.count(tier.number, "open_circuit")
                record.degraded_tier, record.degraded_action = tier.number, "open_circuit"
                response = await self._serve(fallback, "", request, ctx, record, name)
                return _degraded(response, tier.number, "open_circuit")
            model.degrade.count(tier.number, "refused")
            record.degraded_tier, record.degraded_action = tier.number, "refused"
            raise unavailable(
                f"model '{name}' is degraded: tier {tier.number} holds its circuit open (its "
                f"p99 {model.degrade.p99_s * 1000:.0f} ms is past {tier.p99_s * 1000:.0f} ms); "
                "retry later"
            )
        if fallback:
            return await self._serve(fallback, "", request, ctx, record, name)
        raise unavailable(
            f"model '{name}' is failing: its circuit is open, retry in {circuit.retry_in_s():.0f} s"
        )

    def _ready(self, tier: Tier, degrade: Degradation) -> bool:
        """Whether the fallback model can take a tier's share now (else the primary does)."""
        if self._up(degrade.policy.fallback_model):
            return True
        degrade.count(tier.number, "fallback_unavailable")
        return False

    def _up(self, name: str) -> bool:
        model = self.registry.models.get(name)
        return model is not None and model.default_version() is not None

    async def _stale(
        self,
        model_name: str,
        version: str,
        request: InferRequest,
        ctx: CallContext,
        record: RequestRecord,
        tier: Tier,
    ) -> InferResponse | None:
        """A degraded cached model's answer from its cache, fresh or past its TTL (kept for
        degrade_stale_s): None when the cache has none, and the request goes on."""
        mv = self.registry.get(model_name, version, ctx.routing_key or request.id)
        if mv.cache is None or mv.decoupled or request.uses_shared_memory:
            # (a request in shared memory is answered by its own execution: its inputs are
            # mapped, and its outputs written, on the path that runs it)
            return None
        # The checks the request gets on its way to the model: a malformed one is refused,
        # never answered from the cache because its inputs match an entry's.
        mv.signature.bind(request, False)
        classification.requested_classes(request, mv.signature)
        scheduling_parameters(request)
        assert self.response_cache is not None
        cache = self.response_cache
        found = await stale_answer(cache, mv.cache, mv, self.registry, request, record)
        if found is None:
            return None
        tensors, parameters, is_stale = found
        record.model, record.version = mv.name, mv.version
        record.capture_rate = mv.spec.capture.sample_rate
        record.tiered = self.registry.models[mv.name].degrade is not None
        response = InferResponse(
            model_name=mv.name, model_version=mv.version, outputs=tensors, id=request.id
        )
        response.parameters.update(parameters)
        if not is_stale:
            return response  # a fresh hit: what the undegraded path would have answered
        record.degraded_tier, record.degraded_action = tier.number, "stale"
        return _degraded(response, tier.number, "stale")

    def respond(self, call: InferCall, response: InferResponse) -> InferResponse:
        """The answer, to encode: refused before it is built when its tensors alone pass the
        response limit (the adapter checks the exact size too)."""
        limit = self.max_response_bytes
        if limit:
            size = min_wire_bytes(response.outputs)
            if size > limit:
                raise response_too_large(size, limit, at_least=True)
        if call.record.capture_rate:  # sampled: by the answering version's rate
            self.capture.observe(call.record, response)
        return response

    def admit_version(
        self, model_name: str, version: str, ctx: CallContext, record: RequestRecord
    ) -> ModelVersion:
        """The checks before a request's body is read; the version it would go to."""
        gate = self.gate  # the server's own refusals first (inline: the hot path)
        if gate.is_shutting_down:
            raise unavailable("the server is shutting down; retry on another replica")
        if gate.max_inflight and gate.inflight > gate.max_inflight:
            raise shed(
                f"the server has {gate.max_inflight} requests in flight "
                "(--max-inflight-requests); retry later"
            )
        if model_name in self.registry.models:
            record.model = model_name
        early = self.registry.get(model_name, version, ctx.routing_key)
        record.version = early.version
        if early.batcher is not None and early.batcher.refuses_all():
            # Shed before reading and decoding the body: overload answers cost little.
            raise shed(f"model '{model_name}' queue is full; retry later")
        degrade = self.registry.models[model_name].degrade
        record.tiered = degrade is not None
        tier = degrade.current if degrade is not None else None
        if tier is not None and tier.queue_limit and early.batcher is not None:
            assert degrade is not None
            if early.batcher.queue_depth() >= tier.queue_limit:
                # A degraded tier's smaller queue: the excess is refused now, not late.
                degrade.count(tier.number, "refused")
                record.degraded_tier, record.degraded_action = tier.number, "refused"
                raise shed(
                    f"model '{model_name}' is degraded: tier {tier.number} (its p99 "
                    f"{degrade.p99_s * 1000:.0f} ms is past {tier.p99_s * 1000:.0f} ms) bounds "
                    f"its queue to {tier.queue_limit} requests; retry later"
                )
        return early

    async def _serve(
        self,
        model_name: str,
        version: str,
        request: InferRequest,
        ctx: CallContext,
        record: RequestRecord,
        fallback_from: str = "",
    ) -> InferResponse:
        # Resolve again now that the body is in: a version swapped in while it was read
        # takes the request (the old one may be draining), and the request id is known for
        # sticky canary routing.
        mv = self.registry.get(model_name, version, ctx.routing_key or request.id)
        record.model, record.version = mv.name, mv.version
        record.capture_rate = mv.spec.capture.sample_rate
        record.tiered = self.registry.models[mv.name].degrade is not None
        if mv.decoupled:  # a canary version (or the fallback) may be one
            raise unary_to_decoupled(mv.name, ctx)
        # Inputs in shared memory become views of their regions before anything reads them;
        # the lease keeps those regions mapped until the answer is built.
        lease = self.shared_memory.lease(request) if request.uses_shared_memory else None
        try:
            checks = self.checked_signatures
            checked = (
                checks is not None
                and request.signature_generation != 0
                and checks.is_current(mv, request.signature_generation)
            )
            bound = mv.signature.bind(request, checked)
            if request.outputs:  # (classes are asked for by name, on a requested output)
                bound.classes = classification.requested_classes(request, mv.signature)
            record.rows = bound.rows
            bound.ctx = ctx
            # Triton's priority and timeout are request parameters: none, none to read.
            priority, timeout_us = scheduling_parameters(request) if request.parameters else (0, 0)
            if request.parameters or mv.sequence is not None:
                bound.correlation_id, bound.flags = sequence_parameters(
                    request, mv.name, mv.sequence is not None
                )
            if mv.cache is None and mv.ensemble is None:  # most requests: one await less
                assert mv.batcher is not None  # a READY version always has one
                outputs, times = await mv.batcher.submit(
                    bound, priority, timeout_us, ctx.deadline_ns
                )
                tensors = self._conformed(mv, bound, record, outputs, times)
            elif mv.cache is None:  # an ensemble's steps
                tensors = await self._execute(mv, bound, ctx, record, priority, timeout_us)
            else:
                assert self.response_cache is not None  # mv.cache is set only with one
                tensors = await run_cached(
                    self.response_cache, mv.cache, mv, self.registry, request, bound, record,
                    lambda: self._execute(mv, bound, ctx, record, priority, timeout_us),
                )  # fmt: skip
            if lease is not None:
                t0 = time.perf_counter_ns()
                tensors = lease.write_outputs(tensors)
                if record.times is not None:
                    record.times.compute_output_ns += time.perf_counter_ns() - t0
        finally:
            if lease is not None:
                lease.release()
        response = InferResponse(
            model_name=mv.name, model_version=mv.version, outputs=tensors, id=request.id
        )
        if bound.response_parameters:  # a Triton Python model's InferenceResponse(parameters=)
            response.parameters.update(bound.response_parameters)
        if fallback_from:
            response.parameters["fallback_from"] = fallback_from
        return response

    async def _execute(
        self,
        mv: ModelVersion,
        bound: BoundRequest,
        ctx: CallContext,
        record: RequestRecord,
        priority: int,
        timeout_us: int,
    ) -> list[Tensor]:
        """Run the request on its version (its batcher, or an ensemble's steps): its final
        output tensors, conformed to the config and as classes where asked."""
        if mv.ensemble is not None:  # its steps go through their models' schedulers
            record.steps = []
            outputs, times = await mv.ensemble.run(
                self.internal, bound, ctx, priority, timeout_us, record.steps
            )
        else:
            assert mv.batcher is not None  # a READY version always has one
            outputs, times = await mv.batcher.submit(bound, priority, timeout_us, ctx.deadline_ns)
        return self._conformed(mv, bound, record, outputs, times)

    def _conformed(
        self,
        mv: ModelVersion,
        bound: BoundRequest,
        record: RequestRecord,
        outputs: dict[str, Array],
        times: ExecutionTimes,
    ) -> list[Tensor]:
        """The executed request's final output tensors, conformed to the config and as
        classes where asked; its execution times in its record."""
        record.times = times
        t0 = time.perf_counter_ns()
        signature = mv.signature
        try:
            tensors = [
                conform_output(signature, signature.outputs[name], outputs, bound.rows)
                for name in bound.output_names
            ]
        except OutputMismatchError as exc:
            raise _model_error(mv, exc.message) from None
        if bound.classes:
            tensors = classification.apply(tensors, bound.classes, signature)
        times.compute_output_ns += time.perf_counter_ns() - t0
        return tensors


def _degraded(response: InferResponse, tier: int, action: str) -> InferResponse:
    """The answer of a degradation tier says so: the tier, how, and the model that answered
    (a fallback's answer also carries `fallback_from`, as the circuit's fallback does)."""
    response.parameters["degradation_tier"] = tier
    response.parameters["degradation_action"] = action
    response.parameters["degradation_model"] = response.model_name
    return response


def _model_error(mv: ModelVersion, message: str) -> InferdError:
    return InferdError(ErrorKind.MODEL_ERROR, f"model '{mv.name}' version {mv.version}: {message}")
