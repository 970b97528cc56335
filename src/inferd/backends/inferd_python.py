"""inferd's own Python model API: class `Model` in `model.py` (see inferd.python_model).

`predict(inputs)` gets a merged batch; a `predict` with a second parameter named `parameters`
also gets the request parameters, one mapping per row of the batch (the parameters of that
row's request, Triton's reserved keys left out). `load`, `predict` and `unload` may be
`async def`: their coroutines run on the instance's own event loop (model_calls.ModelLoop).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from inferd.backends.base import LoadContext
from inferd.backends.model_calls import ModelLoop
from inferd.backends.pb_utils.host import InstanceModelHost, serving
from inferd.conformance import OutputMismatchError
from inferd.model_output import running_model
from inferd.python_model import ModelContext
from inferd.types import Array


def takes_parameters(model: Any) -> bool:
    """Whether the model's `predict` has a parameter named `parameters`."""
    try:
        return "parameters" in inspect.signature(model.predict).parameters
    except (TypeError, ValueError, AttributeError):
        return False


class PythonInstance:
    """An `Instance` (a `ParametersInstance` when `predict` reads parameters)."""

    device = "cpu"
    provider = "python"

    def __init__(self, ctx: LoadContext, module: ModuleType) -> None:
        self._name = ctx.model_name
        self._module_name = module.__name__
        self._model_dir = str(ctx.version_dir)
        self._batched = ctx.config.max_batch_size > 0
        self._host: InstanceModelHost | None = (
            ctx.host.for_instance(ctx.model_name) if ctx.host is not None else None
        )
        self._loop = ModelLoop(
            f"inferd-model-{ctx.model_name}-{ctx.instance_index}-async", self._marks
        )
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
            self.takes_parameters = takes_parameters(self._model)
        except BaseException:
            self._loop.close()  # an async initialize/load may have started it
            self._release()
            raise

    @contextlib.contextmanager
    def _marks(self) -> Iterator[None]:
        with running_model(self._name), serving(self._host, self._model_dir):
            yield

    def execute(
        self, inputs: dict[str, Array], parameters: Sequence[Mapping[str, Any]] | None = None
    ) -> dict[str, Array]:
        with self._marks():
            if self.takes_parameters:
                if parameters is None:  # no requests behind this batch (warm-up): no parameters
                    parameters = [{} for _ in range(self._rows(inputs))]
                result = self._model.predict(inputs, parameters)
            else:
                result = self._model.predict(inputs)
            outputs = self._loop.resolve(result)
        if not isinstance(outputs, dict):
            raise OutputMismatchError(
                f"predict() must return a dict of output name to array, got "
                f"{type(outputs).__name__}"
            )
        return {name: np.asarray(value) for name, value in outputs.items()}

    def _rows(self, inputs: dict[str, Array]) -> int:
        if not self._batched or not inputs:
            return 1
        return int(next(iter(inputs.values())).shape[0])

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
