"""Calls from inside the server to a model: an ensemble's steps, a Python model's BLS
requests. They take the same steps an adapter takes (unary.py, decoupled.py), so the
called model's routing, admission, circuit, batching, statistics, metrics and request log
apply as to a client's request; the caller's deadline, trace context and routing key carry
over, so a pipeline's timeout covers every stage and each stage gets what is left.

Tensors stay numpy arrays: nothing is encoded or decoded between caller and callee.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Protocol

from inferd.dataplane.unary_request import InferCall, StreamCall
from inferd.events import CallContext
from inferd.streams import StreamResponse
from inferd.types import InferRequest, InferResponse


class ModelCalls(Protocol):
    """What an internal call uses of the DataPlane: its unary and streaming steps."""

    def start(self, model_name: str, version: str, ctx: CallContext) -> InferCall: ...

    def admit(self, call: InferCall) -> None: ...

    async def infer(self, call: InferCall, request: InferRequest) -> InferResponse: ...

    def respond(self, call: InferCall, response: InferResponse) -> InferResponse: ...

    def start_stream(
        self, model_name: str, version: str, ctx: CallContext, fallback_from: str = ""
    ) -> StreamCall: ...

    def admit_stream(self, call: StreamCall) -> None: ...

    async def stream(
        self, call: StreamCall, request: InferRequest
    ) -> AsyncGenerator[StreamResponse, None]: ...


def child_context(parent: CallContext) -> CallContext:
    """The context of a call made on behalf of `parent`: its own start (a stage's latency
    is its own), the parent's deadline, trace context, caller, client and routing key. The
    protocol label stays the parent's, so metric label values stay bounded."""
    return CallContext(
        protocol=parent.protocol,
        client=parent.client,
        traceparent=parent.traceparent,
        wall_start_s=time.time(),
        start_ns=time.perf_counter_ns(),
        routing_key=parent.routing_key,
        deadline_ns=parent.deadline_ns,
        caller=parent.caller,
    )


class InternalCalls:
    """Calls from inside the server to a model through the DataPlane's steps (`steps`): an
    ensemble's (pipelines/ensemble.py's `StepCaller`) and a Python model's BLS requests
    (bls_runner.py)."""

    __slots__ = ("_steps",)

    def __init__(self, steps: ModelCalls) -> None:
        self._steps = steps

    async def call_model(self, request: InferRequest, parent: CallContext) -> InferResponse:
        """One response from `request.model_name`, as a client's unary request would get it;
        failures raise the same `InferdError` a client would see."""
        steps = self._steps
        ctx = child_context(parent)
        with steps.start(request.model_name, request.model_version, ctx) as call:
            steps.admit(call)
            return steps.respond(call, await steps.infer(call, request))

    async def stream_model(
        self, request: InferRequest, parent: CallContext
    ) -> AsyncGenerator[StreamResponse, None]:
        """The responses of `request.model_name` as a stream (a decoupled model's any
        number, a model that is not decoupled once), each item as a stream's adapter gets
        it: a failure before the first response raises; later ones arrive as items holding
        the error."""
        steps = self._steps
        ctx = child_context(parent)
        with steps.start_stream(request.model_name, request.model_version, ctx) as call:
            steps.admit_stream(call)
            items = await steps.stream(call, request)
        async with contextlib.aclosing(items):
            async for item in items:
                yield item
