"""The instance for the class a Python model's `model.py` defines, in whichever process
imported it: the server's (`PythonBackend.load`) or the model's own (`isolated/child.py`)."""

from __future__ import annotations

import sys
from types import ModuleType

from inferd.backends.base import LoadContext
from inferd.backends.python.inferd_model import PythonInstance, StreamingPythonInstance
from inferd.backends.python.triton_model import TritonPythonInstance
from inferd.config.model_config import ConfigError


def instantiate(
    ctx: LoadContext, module: ModuleType, probe_readiness: bool = True
) -> PythonInstance | TritonPythonInstance:
    """The instance for the class model.py defines (`Model` wins over `TritonPythonModel`);
    forgets the module if there is none, or if building it fails."""
    try:
        if hasattr(module, "Model"):
            if ctx.config.model_transaction_policy.decoupled:
                return StreamingPythonInstance(ctx, module)
            return PythonInstance(ctx, module)
        if hasattr(module, "TritonPythonModel"):
            if ctx.config.batch_input:
                # Its execute(requests) gets each request's own tensors, not one merged
                # batch: there is no batch to describe (Triton's Python backend does not
                # create batch inputs either).
                raise ConfigError(
                    f"{ctx.model_name}/config.pbtxt: batch_input: a TritonPythonModel "
                    "receives each request's own tensors, so batch inputs are not "
                    "supported; read each request's shape instead, or define class "
                    "'Model' (inferd's API), which receives the merged batch"
                )
            return TritonPythonInstance(ctx, module, probe_readiness)
        raise RuntimeError(
            "model.py defines no class 'Model' (inferd) or 'TritonPythonModel' "
            "(Triton Python backend)"
        )
    except BaseException:
        sys.modules.pop(module.__name__, None)
        raise
