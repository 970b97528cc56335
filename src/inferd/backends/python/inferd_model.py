"""inferd's own Python model API: class `Model` in `model.py` (see
inferd.backends.python.model_api).

`predict(inputs)` gets a merged batch; a `predict(inputs, requests)` also gets one
`RequestInfo` per request of the batch, in row order (its id, rows, parameters, sequence id
and flags). A decoupled model defines `predict_stream(inputs, responses)` instead. `load`,
`predict` and `unload` may be `async def`: their coroutines run on the instance's own event
loop (model_calls.ModelLoop).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from inferd.backends.base import LoadContext
from inferd.backends.python.model_api import ModelContext, RequestInfo, ResponseSender
from inferd.backends.python.model_code import ModelLoop
from inferd.backends.python.model_prints import running_model
from inferd.backends.python.pb_utils.host import InstanceModelHost, serving
from inferd.errors import ErrorKind, InferdError
from inferd.streams import CollectingSink, guard_release
from inferd.tensors.conformance import OutputMismatchError
from inferd.tensors.signature import BoundRequest
from inferd.types import Array, RequestFields

log = logging.getLogger("inferd.backends.python")


class PythonInstance:
    """An `Instance` (a `RequestInfoInstance` when `predict` takes the requests)."""

    device = "cpu"
    provider = "python"

    def __init__(self, ctx: LoadContext, module: ModuleType) -> None:
        self._name = ctx.model_name
        self._module_name = module.__name__
        self._model_dir = str(ctx.version_dir)
        self._batched = ctx.config.max_batch_size > 0
        self._host: InstanceModelHost | None = (
            ctx.host.for_instance(ctx.model_name, ctx.array_scope())
            if ctx.host is not None
            else None
        )
        task = f"inferd-model-{ctx.model_name}-{ctx.instance_index}"
        self._loop = ModelLoop(f"{task}-async", self._marks)
        try:
            with self._marks():
                self._model: Any = module.Model()
                context = ModelContext(
                    name=ctx.model_name,
                    version=ctx.version,
                    version_dir=ctx.version_dir,
                    max_batch_size=int(ctx.config.max_batch_size),
                    parameters={k: v.string_value for k, v in ctx.config.parameters.items()},
                    instance_index=ctx.instance_index,
                    config=ctx.config,
                )
                if hasattr(self._model, "load"):
                    self._loop.resolve(self._model.load(context))
        except BaseException:
            self._loop.close()  # an async load may have started it
            self._release()
            raise
        predict = getattr(self._model, "predict", None)  # a decoupled model has predict_stream
        self.wants_request_info = predict is not None and _takes_requests(predict)

    @contextlib.contextmanager
    def _marks(self) -> Iterator[None]:
        """While the model's code runs: prints go to its log, pb_utils finds its server."""
        with running_model(self._name), serving(self._host, self._model_dir):
            yield

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        if self.wants_request_info:  # called without them (warm-up): one request per row
            rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
            return self.execute_with_info(inputs, [RequestInfo("warmup")] * rows)
        with self._marks():
            outputs = self._loop.resolve(self._model.predict(inputs))
        return _checked(outputs)

    def execute_with_requests(
        self, inputs: dict[str, Array], requests: Sequence[RequestFields]
    ) -> dict[str, Array]:
        return self.execute_with_info(inputs, [RequestInfo.of(r) for r in requests])

    def execute_with_info(
        self, inputs: dict[str, Array], requests: list[RequestInfo]
    ) -> dict[str, Array]:
        with self._marks():
            result = (
                self._model.predict(inputs, requests)
                if self.wants_request_info
                else self._model.predict(inputs)
            )
            outputs = self._loop.resolve(result)
        return _checked(outputs)

    def close(self) -> None:
        try:
            if hasattr(self._model, "unload"):
                with self._marks():
                    self._loop.resolve(self._model.unload())
        finally:
            self._loop.close()
            self._release()
            del self._model

    def _release(self) -> None:
        sys.modules.pop(self._module_name, None)
        if self._host is not None:
            self._host.close()


def _takes_requests(predict: Any) -> bool:
    """Whether `predict` (bound) accepts a second positional argument: the requests."""
    try:
        params = list(inspect.signature(predict).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


def _checked(outputs: Any) -> dict[str, Array]:
    if not isinstance(outputs, dict):
        raise OutputMismatchError(
            f"predict() must return a dict of output name to array, got {type(outputs).__name__}"
        )
    return {name: np.asarray(value) for name, value in outputs.items()}


class StreamingPythonInstance(PythonInstance):
    """A decoupled `Model`: `predict_stream(inputs, responses)` once per request, each
    request's responses going to its own stream (a `RequestListInstance`)."""

    def __init__(self, ctx: LoadContext, module: ModuleType) -> None:
        if not callable(getattr(module.Model, "predict_stream", None)):
            raise RuntimeError(
                "a decoupled model (model_transaction_policy decoupled) must define "
                "Model.predict_stream(inputs, responses)"
            )
        super().__init__(ctx, module)

    def execute_requests(
        self, requests: list[BoundRequest]
    ) -> list[dict[str, Array] | InferdError]:
        results: list[dict[str, Array] | InferdError] = []
        for request in requests:
            sink = request.responses if request.responses is not None else CollectingSink()
            sender = ResponseSender(sink, self._name, request.request_id, request.parameters)
            guard_release(sender, sink, self._name)
            sink.started()
            try:
                with self._marks():
                    returned = self._loop.resolve(
                        self._model.predict_stream(request.inputs, sender)
                    )
                if returned is not None:
                    raise RuntimeError(
                        f"predict_stream() returned {type(returned).__name__}; it must return "
                        "None and send its responses through `responses`"
                    )
            except Exception as exc:
                # This request fails alone: the others of the batch still run.
                error = InferdError(ErrorKind.MODEL_ERROR, f"model '{self._name}': {exc}")
                if not sink.fail(error):  # its stream had ended: no client hears of it
                    log.warning("%s (after the request's final flag)", error.message)
                results.append(error)
            else:
                results.append({})
            del sender  # released now: a model that kept no reference and sent no final flag
        return results
