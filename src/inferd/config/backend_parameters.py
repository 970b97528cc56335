"""The backend's own `parameters` (parameters.BACKEND_PARAMETERS), parsed once at load
into `BackendSettings`, part of the model spec.

Only the keys of the model's own backend are read: a Python model's other keys are its own
(they pass through to model.py), so inferd must not judge them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError, backend_name, int_parameter, parameter

ISOLATIONS = ("thread", "process")


@dataclass(frozen=True, slots=True)
class BackendSettings:
    # ONNX Runtime and PyTorch: intra-op threads per instance; None: the cores split
    # between the instances (`intra_op_threads`).
    intra_op_thread_count: int | None = None
    inter_op_thread_count: int = 0  # ONNX Runtime: 0 lets it choose
    parallel_execution: bool = False  # ONNX Runtime: execution_mode 1
    torch_compile: bool = False
    isolation: str = "thread"  # Python: "thread" or "process"

    def intra_op_threads(self, instance_count: int) -> int:
        if self.intra_op_thread_count is not None:
            return self.intra_op_thread_count
        # Instances run in parallel: split the cores between them rather than letting each
        # spin up one thread per core and oversubscribe the machine.
        return max(1, (os.cpu_count() or 1) // instance_count)


def read_backend_settings(config: mc.ModelConfig) -> BackendSettings:
    """The settings of `config`'s backend; raises `ConfigError` naming the parameter and value."""
    backend = backend_name(config)
    if backend == "onnxruntime":
        mode = int_parameter(config, "execution_mode", 0)
        if mode not in (0, 1):
            raise ConfigError(
                f"{config.name}/config.pbtxt: parameters.execution_mode must be 0 "
                f"(sequential) or 1 (parallel), got {mode}"
            )
        return BackendSettings(
            intra_op_thread_count=_optional_int(config, ("intra_op_thread_count",)),
            inter_op_thread_count=int_parameter(config, "inter_op_thread_count", 0),
            parallel_execution=mode == 1,
        )
    if backend == "pytorch":
        return BackendSettings(
            intra_op_thread_count=_optional_int(
                config, ("INTRA_OP_THREAD_COUNT", "intra_op_thread_count")
            ),
            torch_compile=parameter(config, "torch_compile", "false").lower() in ("1", "true"),
        )
    if backend == "python":
        return BackendSettings(isolation=isolation_of(config))
    return BackendSettings()


def isolation_of(config: mc.ModelConfig) -> str:
    """A Python model's `isolation`; needed before the spec too (its config completion).
    A model with its own environment (EXECUTION_ENV_PATH) runs in a process of its own."""
    given = parameter(config, "isolation", "")
    if given and given not in ISOLATIONS:
        raise ConfigError(
            f"{config.name}/config.pbtxt: parameters: isolation '{given}' is not "
            'supported; use "process" (a worker process of its own) or "thread" (default)'
        )
    if execution_env_path(config):
        if given == "thread":
            raise ConfigError(
                f"{config.name}/config.pbtxt: parameters: isolation 'thread' cannot run the "
                "model in its own environment (EXECUTION_ENV_PATH): that needs a process of "
                'its own; remove isolation or set it to "process"'
            )
        return "process"
    return given or "thread"


def execution_env_path(config: mc.ModelConfig) -> str:
    """A Python model's EXECUTION_ENV_PATH as written ("" when it has none)."""
    return parameter(config, "EXECUTION_ENV_PATH").strip()


def _optional_int(config: mc.ModelConfig, keys: tuple[str, ...]) -> int | None:
    if not any(parameter(config, key) for key in keys):
        return None
    return int_parameter(config, keys, 0)
