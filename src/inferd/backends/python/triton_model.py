"""Models written for Triton's Python backend: class `TritonPythonModel` in `model.py`.

Triton's contract: `initialize(args)` once per instance, `execute(requests)` with the list of
requests of one batch (each request keeps its own tensors and parameters) returning one
`pb_utils.InferenceResponse` per request, `is_ready()` on readiness probes, `finalize()` at
unload. A decoupled model's `execute` returns None and answers through each request's
response sender instead. `execute` (and `is_ready`) may be `async def`: the coroutine runs on
the instance's own event loop (model_calls.ModelLoop); a decoupled model's is not waited for,
as in Triton. The same class runs in the server process and, with `isolation: "process"`
(decoupled models excepted), in a worker process (backends/python/isolated/child.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from inferd.backends.base import LoadContext
from inferd.backends.python import pb_utils
from inferd.backends.python.model_code import ModelLoop, ReadinessCheck
from inferd.backends.python.model_prints import running_model
from inferd.backends.python.pb_utils.host import InstanceModelHost, serving
from inferd.config.model_config import instance_group_of, to_json
from inferd.errors import ErrorKind, InferdError
from inferd.streams import CollectingSink, ResponseSink, guard_release
from inferd.tensors.conformance import OutputMismatchError
from inferd.tensors.signature import BoundRequest
from inferd.types import Array

log = logging.getLogger("inferd.backends.python")

# What a TritonError's code becomes (Triton's HTTP and gRPC statuses for the same codes);
# UNKNOWN, INTERNAL, ALREADY_EXISTS and CANCELLED fail the request as a model error.
_ERROR_KINDS = {
    pb_utils.TritonError.INVALID_ARG: ErrorKind.INVALID_ARGUMENT,
    pb_utils.TritonError.UNSUPPORTED: ErrorKind.INVALID_ARGUMENT,
    pb_utils.TritonError.NOT_FOUND: ErrorKind.NOT_FOUND,
    pb_utils.TritonError.UNAVAILABLE: ErrorKind.UNAVAILABLE,
}


def initialize_args(ctx: LoadContext) -> dict[str, str]:
    """The `args` dict Triton passes to `initialize`, every value a string."""
    return {
        "model_config": json.dumps(to_json(ctx.config)),
        "model_instance_kind": "CPU",
        "model_instance_name": instance_group_of(ctx.config, ctx.instance_index).instance_name(
            ctx.model_name
        ),
        "model_instance_device_id": "0",
        "model_repository": str(ctx.version_dir.parent),
        "model_version": ctx.version,
        "model_name": ctx.model_name,
    }


class TritonPythonInstance:
    """One `TritonPythonModel` object; a `RequestListInstance` for the batcher."""

    device = "cpu"
    provider = "python"

    def __init__(self, ctx: LoadContext, module: ModuleType, probe_readiness: bool = True) -> None:
        """`probe_readiness`: answer `is_alive()` from the model's `is_ready()` (False in a
        worker process, whose parent asks `check_ready()` over a pipe of its own)."""
        self._name = ctx.model_name
        self._module_name = module.__name__
        self._model_dir = str(ctx.version_dir)
        self._batched = ctx.config.max_batch_size > 0
        self._decoupled = bool(ctx.config.model_transaction_policy.decoupled)
        self._host: InstanceModelHost | None = (
            ctx.host.for_instance(ctx.model_name, ctx.array_scope())
            if ctx.host is not None
            else None
        )
        task = f"inferd-model-{ctx.model_name}-{ctx.instance_index}"
        self._loop = ModelLoop(f"{task}-async", self._marks)
        self._readiness: ReadinessCheck | None = None
        try:
            with self._marks():
                self._model: Any = module.TritonPythonModel()
                if hasattr(self._model, "initialize"):
                    self._loop.resolve(self._model.initialize(initialize_args(ctx)))
            self.has_is_ready = hasattr(self._model, "is_ready")
            if self.has_is_ready and probe_readiness:
                self._readiness = ReadinessCheck(task, self.check_ready)
        except BaseException:
            self._loop.close()  # an async initialize/load may have started it
            self._release()
            raise

    @contextlib.contextmanager
    def _marks(self) -> Iterator[None]:
        """While the model's code runs: prints go to its log, pb_utils finds its server."""
        with running_model(self._name), serving(self._host, self._model_dir):
            yield

    def check_ready(self) -> bool:
        """Ask the model's `is_ready()` now (blocking; any thread but the event loop's)."""
        with self._marks():
            answer: bool = self._loop.resolve(self._model.is_ready())
        return answer

    def is_alive(self) -> bool:
        """A `SupervisedInstance`: what the model's `is_ready()` said last (True without)."""
        return self._readiness is None or self._readiness.ready()

    def execute_requests(
        self, requests: list[BoundRequest]
    ) -> list[dict[str, Array] | InferdError]:
        triton_requests = [
            pb_utils.InferenceRequest.incoming(
                [pb_utils.Tensor(name, array) for name, array in r.inputs.items()],
                r.request_id,
                r.output_names,
                r.parameters,
                r.timeout_us,
                None if self._decoupled else r.is_cancelled,  # a stream knows better
                r.correlation_id,
                r.flags,
            )
            for r in requests
        ]
        if self._decoupled:
            return self._execute_decoupled(requests, triton_requests)
        # An exception here fails every request of the batch, as in Triton.
        with self._marks():
            responses = self._loop.resolve(self._model.execute(triton_requests))
        if not isinstance(responses, list | tuple) or len(responses) != len(requests):
            got = (
                f"{len(responses)} responses"
                if isinstance(responses, list | tuple)
                else type(responses).__name__
            )
            raise InferdError(
                ErrorKind.MODEL_ERROR,
                f"execute() returned {got} for {len(requests)} requests; it must return a "
                "list with one pb_utils.InferenceResponse per request, in order",
            )
        return [self._result(resp, req) for resp, req in zip(responses, requests, strict=True)]

    def _execute_decoupled(
        self, requests: list[BoundRequest], triton_requests: list[pb_utils.InferenceRequest]
    ) -> list[dict[str, Array] | InferdError]:
        """`execute` returns None; each request's responses go through its sender, now or
        later from a thread of the model's. The result per request is empty: its stream
        carries the answer. An `async def execute` runs on, and is not waited for: the
        instance takes its next batch meanwhile (Triton's async decoupled execute)."""
        sinks: list[ResponseSink] = []
        for request, triton_request in zip(requests, triton_requests, strict=True):
            sink = request.responses if request.responses is not None else CollectingSink()
            sender = pb_utils.InferenceResponseSender(
                sink, functools.partial(self._stream_outputs, request=request)
            )
            guard_release(sender, sink, self._name)
            triton_request._sender = sender
            sink.started()
            sinks.append(sink)
        try:
            with self._marks():
                returned = self._model.execute(triton_requests)
            if asyncio.iscoroutine(returned):
                self._loop.submit(returned, functools.partial(self._failed_later, sinks))
            elif returned is not None:
                raise TypeError(
                    f"execute() returned {type(returned).__name__}; a decoupled model "
                    "(model_transaction_policy decoupled) must return None and send its "
                    "responses through request.get_response_sender()"
                )
        except Exception as exc:
            # Before the senders can be released: the client gets this message, not the
            # "released without the final flag" one. As in Triton, every request fails.
            self._failed_later(sinks, exc)
            raise
        return [{} for _ in requests]

    def _failed_later(self, sinks: list[ResponseSink], exc: BaseException) -> None:
        error = InferdError(ErrorKind.MODEL_ERROR, f"model '{self._name}': {exc}")
        failed = [sink.fail(error) for sink in sinks]
        if not any(failed):  # every stream had ended: no client hears of it, the log must
            log.warning("%s (after its requests' final flags)", error.message)

    def _stream_outputs(
        self, response: pb_utils.InferenceResponse, request: BoundRequest
    ) -> dict[str, Array]:
        result = self._result(response, request)
        if isinstance(result, InferdError):
            raise InferdError(result.kind, f"model '{self._name}': {result.message}")
        return result

    def _result(self, response: object, request: BoundRequest) -> dict[str, Array] | InferdError:
        if not isinstance(response, pb_utils.InferenceResponse):
            return InferdError(
                ErrorKind.MODEL_ERROR,
                f"execute() returned {type(response).__name__} for a request; expected "
                "pb_utils.InferenceResponse",
            )
        error = response.error()
        if error is not None:
            kind = _ERROR_KINDS.get(error.code(), ErrorKind.MODEL_ERROR)
            return InferdError(kind, str(error.message()))
        outputs: dict[str, Array] = {}
        for tensor in response.output_tensors():
            if not isinstance(tensor, pb_utils.Tensor):
                return InferdError(
                    ErrorKind.MODEL_ERROR,
                    f"a response holds {type(tensor).__name__}; output_tensors must be "
                    "pb_utils.Tensor objects",
                )
            array = np.asarray(tensor.as_numpy())
            if self._batched and (array.ndim == 0 or array.shape[0] != request.rows):
                return OutputMismatchError(
                    f"output '{tensor.name()}' has shape {list(array.shape)} for a request "
                    f"of batch size {request.rows}; {self._name}/config.pbtxt sets "
                    "max_batch_size, so each response must keep its request's batch dimension",
                )
            outputs[tensor.name()] = array
        parameters = response.parameters_dict()
        if parameters:
            request.response_parameters = parameters
        return outputs

    def close(self) -> None:
        try:
            if self._readiness is not None:
                self._readiness.close()
            self._loop.close()  # as Triton: the event loop stops before finalize
            if hasattr(self._model, "finalize"):
                with self._marks():
                    self._loop.resolve(self._model.finalize())
        finally:
            self._loop.close()
            self._release()
            del self._model

    def _release(self) -> None:
        sys.modules.pop(self._module_name, None)
        if self._host is not None:
            self._host.close()
