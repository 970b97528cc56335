"""Python backend: `<version>/model.py` defining class `Model` (see `inferd.python_model`),
or class `TritonPythonModel` (Triton's Python-backend contract, see `triton_python`)."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends import pb_utils
from inferd.backends.base import LoadContext
from inferd.backends.triton_python import TritonPythonInstance
from inferd.backends.worker_process import ProcessInstance
from inferd.backends.worker_stream import StreamingProcessInstance
from inferd.conformance import OutputMismatchError
from inferd.errors import ErrorKind, InferdError
from inferd.model_output import running_model
from inferd.python_model import ModelContext, RequestInfo, ResponseSender
from inferd.repository.config import ConfigError, instance_group_of, parameter
from inferd.signature import BoundRequest
from inferd.streams import CollectingSink, guard_release
from inferd.types import Array

log = logging.getLogger("inferd.backends.python")

KIND_GPU = mc.ModelInstanceGroup.KIND_GPU

_module_ids = itertools.count()


class PythonBackend:
    model_file = "model.py"
    model_files: tuple[str, ...] = ("model.py",)
    decodes_bytes_as_text = False

    def complete_config(self, config: mc.ModelConfig, version_dir: Path) -> None:
        # A Python file says nothing about its tensors: the config must declare them.
        if not config.input or not config.output:
            raise ConfigError(
                f"{config.name}/config.pbtxt: input/output: a Python model must declare "
                "its inputs and outputs"
            )
        isolation = parameter(config, "isolation", "thread")
        if isolation not in ("process", "thread"):
            raise ConfigError(
                f"{config.name}/config.pbtxt: parameters: isolation '{isolation}' is not "
                'supported; use "process" (a worker process of its own) or "thread" (default)'
            )

    def load(self, ctx: LoadContext) -> PythonInstance | TritonPythonInstance | ProcessInstance:
        if instance_group_of(ctx.config, ctx.instance_index).group.kind == KIND_GPU:
            # Field lesson 5: the wish for a GPU is visible, and what was done instead.
            log.warning(
                "model %s v%s instance %d asked for KIND_GPU but Python models run as CPU "
                "instances (model_instance_kind CPU); the config API reports KIND_CPU",
                ctx.model_name,
                ctx.version,
                ctx.instance_index,
            )
        isolation = parameter(ctx.config, "isolation", "thread")
        if isolation == "process":
            # model.py is imported in the worker process only: its import may crash too.
            if ctx.config.model_transaction_policy.decoupled:
                return StreamingProcessInstance(ctx)
            return ProcessInstance(ctx)
        if isolation not in ("", "thread"):
            raise ConfigError(
                f"{ctx.model_name}/config.pbtxt: parameters: isolation '{isolation}' is not "
                'supported; use "process" (its own worker process) or "thread" (default)'
            )
        module = import_model_module(ctx)
        try:
            if hasattr(module, "Model"):
                if ctx.config.model_transaction_policy.decoupled:
                    return StreamingPythonInstance(ctx, module)
                return PythonInstance(ctx, module)
            if hasattr(module, "TritonPythonModel"):
                if ctx.config.batch_input:
                    # Its execute(requests) gets each request's own tensors, not one
                    # merged batch: there is no batch to describe (Triton's Python
                    # backend does not create batch inputs either).
                    raise ConfigError(
                        f"{ctx.model_name}/config.pbtxt: batch_input: a TritonPythonModel "
                        "receives each request's own tensors, so batch inputs are not "
                        "supported; read each request's shape instead, or define class "
                        "'Model' (inferd's API), which receives the merged batch"
                    )
                return TritonPythonInstance(ctx, module)
            raise RuntimeError(
                "model.py defines no class 'Model' (inferd) or 'TritonPythonModel' "
                "(Triton Python backend)"
            )
        except BaseException:
            sys.modules.pop(module.__name__, None)
            raise


def import_model_module(ctx: LoadContext) -> ModuleType:
    """Execute `<version>/model.py` as a fresh module, its prints going to the model's log.

    `triton_python_backend_utils` is made importable first (inferd's `pb_utils`), so that
    models written for Triton's Python backend import unchanged.
    """
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    path = ctx.version_dir / PythonBackend.model_file
    module_name = f"inferd_model_{next(_module_ids)}_{ctx.model_name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {ctx.model_name}/{ctx.version}/model.py")
    module = importlib.util.module_from_spec(spec)
    # Registered so that pickling and dataclasses inside the model module work.
    sys.modules[module_name] = module
    try:
        with running_model(ctx.model_name):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


class PythonInstance:
    device = "cpu"
    provider = "python"

    def __init__(self, ctx: LoadContext, module: ModuleType) -> None:
        self._name = ctx.model_name
        self._module_name = module.__name__
        self._batched = ctx.config.max_batch_size > 0
        with running_model(self._name):
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
                self._model.load(context)
        predict = getattr(self._model, "predict", None)  # a decoupled model has predict_stream
        self.wants_request_info = predict is not None and _takes_requests(predict)

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        if self.wants_request_info:  # called without them (warm-up): one request per row
            rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
            return self.execute_with_info(inputs, [RequestInfo("warmup")] * rows)
        with running_model(self._name):
            outputs = self._model.predict(inputs)
        return _checked(outputs)

    def execute_with_info(
        self, inputs: dict[str, Array], requests: list[RequestInfo]
    ) -> dict[str, Array]:
        with running_model(self._name):
            outputs = (
                self._model.predict(inputs, requests)
                if self.wants_request_info
                else self._model.predict(inputs)
            )
        return _checked(outputs)

    def close(self) -> None:
        try:
            if hasattr(self._model, "unload"):
                with running_model(self._name):
                    self._model.unload()
        finally:
            sys.modules.pop(self._module_name, None)
            del self._model


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
                with running_model(self._name):
                    returned = self._model.predict_stream(request.inputs, sender)
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
