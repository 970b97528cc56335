"""Python backend: `<version>/model.py` defining class `Model` (inferd's API, see
`inferd.python_model` and `inferd_python`), or class `TritonPythonModel` (Triton's
Python-backend contract, see `triton_python`); in a worker thread of the server, or with
`isolation: "process"` in a worker process of its own (`worker_process`)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import ModuleType

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.backends.inferd_python import PythonInstance, StreamingPythonInstance
from inferd.backends.python_autocomplete import apply_completion, completed_config
from inferd.backends.python_import import MODEL_FILE, import_model_module, may_define_triton_model
from inferd.backends.triton_python import TritonPythonInstance
from inferd.backends.worker_process import (
    ProcessInstance,
    auto_complete_in_worker,
    start_process_instance,
)
from inferd.repository.config import (
    CONFIG_FILE,
    ConfigError,
    config_needed,
    instance_group_of,
)
from inferd.repository.spec_backend import isolation_of

log = logging.getLogger("inferd.backends.python")

KIND_GPU = mc.ModelInstanceGroup.KIND_GPU


class PythonBackend:
    model_file = MODEL_FILE
    model_files: tuple[str, ...] = (MODEL_FILE,)
    decodes_bytes_as_text = False
    passes_request_parameters = True  # Triton's request.parameters(), inferd's predict(...)

    def complete_config(self, config: mc.ModelConfig, version_dir: Path) -> None:
        """Triton's auto_complete_config, if model.py defines it; then the config must
        declare the model's tensors (a Python file says nothing about them)."""
        isolation = isolation_of(config)
        if may_define_triton_model(version_dir):
            if isolation == "process":
                completed = auto_complete_in_worker(config, version_dir)
            else:
                completed = completed_config(config.name, version_dir, config)
            if completed is not None:
                apply_completion(config, completed, version_dir.name)
        if config.input and config.output:
            return
        hint = (
            " (or give its TritonPythonModel an auto_complete_config that adds them with "
            "add_input and add_output)"
        )
        if not (version_dir.parent / CONFIG_FILE).exists():
            raise ConfigError(
                config_needed(
                    config.name, 'backend: "python"', f"{version_dir.name}/{MODEL_FILE}", hint
                )
            )
        missing = "input" if not config.input else "output"
        raise ConfigError(
            f"{config.name}/config.pbtxt: {missing}: a Python model must declare its inputs "
            f"and outputs{hint}"
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
        if ctx.backend_settings().isolation == "process":
            # model.py is imported in the worker process only: its import may crash too.
            return start_process_instance(ctx)
        return instantiate(ctx, import_model_module(ctx.model_name, ctx.version_dir))


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
