"""Python backend: `<version>/model.py` defining class `Model` (inferd's API, see
model_api.py and inferd_model.py), or class `TritonPythonModel` (Triton's Python-backend
contract, see triton_model.py); in a thread of the server, or with `isolation: "process"` in
a process of its own (isolated/isolated_instance.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.backends.python.autocomplete import apply_completion, completed_config
from inferd.backends.python.inferd_model import PythonInstance
from inferd.backends.python.instantiate import instantiate
from inferd.backends.python.isolated.execution_env import env_for
from inferd.backends.python.isolated.isolated_instance import (
    ProcessInstance,
    TritonProcessInstance,
    auto_complete_in_process,
)
from inferd.backends.python.isolated.parent_stream import StreamingProcessInstance
from inferd.backends.python.isolated.pipe import start_model_process
from inferd.backends.python.isolated.process_spec import ProcessSpec
from inferd.backends.python.model_import import (
    MODEL_FILE,
    import_model_module,
    may_define_triton_model,
)
from inferd.backends.python.triton_model import TritonPythonInstance
from inferd.config.backend_parameters import isolation_of
from inferd.config.model_config import (
    CONFIG_FILE,
    ConfigError,
    config_needed,
    instance_group_of,
)

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
                completed = auto_complete_in_process(config, version_dir)
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


def start_process_instance(ctx: LoadContext) -> ProcessInstance:
    """The instance for the model class the worker found in model.py."""
    host = (
        ctx.host.for_instance(ctx.model_name, ctx.array_scope()) if ctx.host is not None else None
    )
    spec = ProcessSpec.from_context(ctx, env=env_for(ctx.config, ctx.version_dir))
    try:
        worker, info = start_model_process(spec, lambda w: None, host)
    except BaseException:
        if host is not None:
            host.close()
        raise
    cls: type[ProcessInstance] = ProcessInstance
    if info["api"] == "triton":
        cls = TritonProcessInstance
    elif ctx.config.model_transaction_policy.decoupled:
        cls = StreamingProcessInstance
    return cls(ctx, spec, host, worker, info)
