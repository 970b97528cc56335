"""The DataPlane's streaming inference, in explicit steps the adapters call in order:

    with dataplane.start_stream(model, version, ctx) as call:   # counted in flight
        dataplane.admit_stream(call)                              # before the body is read
        request = <the adapter decodes its wire message>
        items = await dataplane.stream(call, request)
    async with contextlib.aclosing(items):                      # iterated at once
        async for item in items: <the adapter encodes `item`>

A model that is not decoupled answers through `infer`, once, and the call tells its record at
the end of the `with`, as the unary steps do (unary.py). For a decoupled model `stream`
admits the request to its batcher as a `DecoupledCall` (decoupled_request.py), which takes the
call's record and tells it when the stream ends. Either way a stream's request counts once,
under the model it was sent to, failures included.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from inferd.dataplane.decoupled_request import DecoupledCall
from inferd.dataplane.request_gate import RequestGate
from inferd.dataplane.unary_request import InferCall, StreamCall
from inferd.errors import ErrorKind, InferdError, invalid, unavailable
from inferd.events import CallContext, RequestRecord
from inferd.repository.model_state import ModelVersion
from inferd.repository.registry import ModelRegistry
from inferd.scheduling.admission import scheduling_parameters
from inferd.scheduling.sequence.sequence_parameters import sequence_parameters
from inferd.streams import StreamResponse
from inferd.tensors import classification
from inferd.types import InferRequest, InferResponse


def unary_to_decoupled(model: str, ctx: CallContext) -> InferdError:
    """Triton's answer to a one-response call to a decoupled model, with where to go."""
    if ctx.protocol == "grpc":
        message = (
            "ModelInfer RPC doesn't support models with decoupled transaction policy; "
            f"model '{model}' answers over ModelStreamInfer"
        )
    else:
        message = (
            "HTTP end point doesn't support models with decoupled transaction policy; "
            f"model '{model}' answers over POST /v2/models/{model}/generate_stream"
        )
    return InferdError(ErrorKind.UNSUPPORTED, message)


class _Unary(Protocol):
    """What the streaming steps use of the unary ones (unary.py's `UnarySteps`)."""

    gate: RequestGate

    def admit(self, call: InferCall) -> None: ...

    async def infer(self, call: InferCall, request: InferRequest) -> InferResponse: ...

    def respond(self, call: InferCall, response: InferResponse) -> InferResponse: ...

    def admit_version(
        self, model_name: str, version: str, ctx: CallContext, record: RequestRecord
    ) -> ModelVersion: ...


class StreamingSteps:
    """The streaming steps of every request to a model that may answer as a stream (the
    module's docstring shows their order); a model that is not decoupled answers through
    the unary steps, once."""

    def __init__(self, registry: ModelRegistry, unary: _Unary) -> None:
        self.registry = registry
        self.unary = unary

    def start_stream(
        self, model_name: str, version: str, ctx: CallContext, fallback_from: str = ""
    ) -> StreamCall:
        """A streaming request begins: counted in flight until its `with` ends, or, for a
        decoupled model, until its stream does."""
        return StreamCall(self.unary.gate, model_name, version, ctx, fallback_from)

    def admit_stream(self, call: StreamCall) -> None:
        """The checks before the body is read; whether the model answers as a stream."""
        try:
            mv = self.registry.get(call.model_name, call.version, call.ctx.routing_key)
            call.decoupled = mv.decoupled
        except InferdError:
            call.decoupled = False  # `admit` answers (and counts) the lookup's error
        if call.decoupled:
            self.unary.admit_version(call.model_name, call.version, call.ctx, call.record)
        else:
            self.unary.admit(call)

    async def stream(
        self, call: StreamCall, request: InferRequest
    ) -> AsyncGenerator[StreamResponse, None]:
        """The responses to an admitted request, to iterate at once: a decoupled model's any
        number, then an item with `final` set (a response, an error or the final flag
        alone); a model that is not decoupled answers once, as `infer`. A failure before the
        first response raises (here or at the first item), as in `infer`; later ones arrive
        as items holding the error."""
        if not call.decoupled:
            unary = self.unary
            response = unary.respond(call, await unary.infer(call, request))
            if call.fallback_from:
                response.parameters["fallback_from"] = call.fallback_from
            return _once(StreamResponse(response, None, True))
        record, ctx, model_name = call.record, call.ctx, call.model_name
        record.request = request
        record.request_id = request.id
        circuit = self.registry.models[model_name].circuit
        if not circuit.allow():
            fallback = circuit.policy.fallback_model
            if not fallback:
                raise unavailable(
                    f"model '{model_name}' is failing: its circuit is open, retry in "
                    f"{circuit.retry_in_s():.0f} s"
                )
            # Served and counted as the fallback model's request, as `infer` does.
            call.drop()
            with self.start_stream(fallback, "", ctx, fallback_from=model_name) as other:
                self.admit_stream(other)
                return await self.stream(other, request)
        mv = self.registry.get(model_name, call.version, ctx.routing_key or request.id)
        record.model, record.version = mv.name, mv.version
        record.tiered = self.registry.models[mv.name].degrade is not None
        if not mv.decoupled:  # a canary version routed by request id may not be
            raise unavailable(
                f"model '{model_name}' version {mv.version} is not decoupled, but the "
                "version this stream was opened for is: serve versions of one "
                "transaction policy side by side"
            )
        if request.uses_shared_memory:
            raise invalid(
                f"model '{mv.name}' is decoupled: its responses cannot be written to "
                "shared memory regions; send its inputs and take its outputs in the "
                "request and responses"
            )
        bound = mv.signature.bind(request)
        bound.classes = classification.requested_classes(request, mv.signature)
        record.rows = bound.rows
        bound.ctx = ctx
        priority, timeout_us = scheduling_parameters(request)
        if request.parameters or mv.sequence is not None:
            bound.correlation_id, bound.flags = sequence_parameters(
                request, mv.name, mv.sequence is not None
            )
        scheduling = (priority, timeout_us, ctx.deadline_ns)
        decoupled = DecoupledCall(call, mv, bound, scheduling, circuit)
        call.hand_over()  # the stream tells the record when it ends
        return decoupled.responses()


async def _once(item: StreamResponse) -> AsyncGenerator[StreamResponse, None]:
    yield item
