"""The model to optimise, as the repository holds it: its directory, version, file, format,
config, signature and the runtime settings the server would give it.

Read from the repository layout and `config.pbtxt` only (no server internals), so what is
measured here runs the way the server will run it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import triton_to_np_dtype

from inferd.public import (
    ConfigError,
    backend_name,
    instance_count,
    int_parameter,
    read_config,
)
from inferd_tools.optimize.errors import OptimizeError

ONNX = "onnx"
TORCHSCRIPT = "torchscript"
TORCH_EXPORT = "torch_export"

FORMAT_NAMES = {ONNX: "ONNX", TORCHSCRIPT: "TorchScript", TORCH_EXPORT: "torch.export"}
# The file each format is served from (Triton's names; inferd accepts no others).
MODEL_FILE = {ONNX: "model.onnx", TORCHSCRIPT: "model.pt", TORCH_EXPORT: "model.pt2"}

# ONNX Runtime's type names -> numpy (the numeric types a quantiser can meet).
ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}

# Triton's default max_batch_size for a config completed from an ONNX file whose tensors all
# have a variable first dimension (its --default-max-batch-size; inferd's backend uses it too).
AUTO_MAX_BATCH_SIZE = 4


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype[np.generic]
    dims: tuple[int, ...]  # per row for a batching model, else the whole shape; -1: variable


@dataclass(frozen=True)
class RuntimeSettings:
    """What the server's instance would run with (the config's parameters)."""

    intra_op_threads: int
    inter_op_threads: int
    parallel_execution: bool
    graph_level: int  # Triton's optimization.graph.level (0: the default, all optimisations)


@dataclass
class OriginalModel:
    name: str
    repository: Path
    model_dir: Path
    version: int
    versions: list[int]  # every version on disk, ascending
    model_file: Path
    format: str  # ONNX, TORCHSCRIPT or TORCH_EXPORT
    config: mc.ModelConfig
    has_config: bool
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int  # 0: the model takes no batch dimension
    runtime: RuntimeSettings

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def next_version(self) -> int:
        return self.versions[-1] + 1

    @property
    def preferred_batch(self) -> int:
        """The batch the speed-up is judged at: the largest preferred_batch_size, else
        max_batch_size when dynamic batching is on, else 1 (docs/optimize.md)."""
        if not self.batched:
            return 1
        preferred = [int(b) for b in self.config.dynamic_batching.preferred_batch_size]
        if preferred:
            return min(max(preferred), self.max_batch_size)
        if self.config.HasField("dynamic_batching"):
            return self.max_batch_size
        return 1

    def batch_sizes(self) -> list[int]:
        """Measured at batch 1, the preferred batch and max_batch_size."""
        return sorted({1, self.preferred_batch, max(1, self.max_batch_size)})


# What each format needs installed, beyond inferd's own dependencies.
NEEDS = {
    ONNX: ("onnx", "pip install 'inferd[optimize]'"),
    TORCHSCRIPT: ("torch", "pip install 'inferd[torch]'"),
    TORCH_EXPORT: ("torch", "pip install 'inferd[torch]'"),
}


def check_installed(model: OriginalModel) -> None:
    import importlib.util

    module, install = NEEDS[model.format]
    if importlib.util.find_spec(module) is None:
        raise OptimizeError(
            f"{model.name}: optimising an {FORMAT_NAMES[model.format]} model needs {module}: "
            f"{install}"
        )


def open_model(repository: Path, name: str, version: int | None) -> OriginalModel:
    if not repository.is_dir():
        raise OptimizeError(f"--model-repository {repository}: no such directory")
    model_dir = repository / name
    if not model_dir.is_dir():
        raise OptimizeError(f"-m {name}: no model directory {model_dir}")
    try:
        config, has_config = read_config(model_dir)
    except ConfigError as e:
        raise OptimizeError(str(e)) from None
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise OptimizeError(f"{name}: no version directory (e.g. {name}/1/model.onnx)")
    if version is None:
        version = versions[-1]
    elif version not in versions:
        raise OptimizeError(
            f"--version {version}: {name} has versions {', '.join(map(str, versions))}"
        )
    version_dir = model_dir / str(version)
    fmt = _format(name, config, version_dir)
    model_file = version_dir / MODEL_FILE[fmt]
    if not model_file.is_file():
        raise OptimizeError(f"{name}/{version}: no {MODEL_FILE[fmt]}")
    where = f"{name}/config.pbtxt"
    try:
        runtime = RuntimeSettings(
            intra_op_threads=int_parameter(
                config,
                ("intra_op_thread_count", "INTRA_OP_THREAD_COUNT"),
                max(1, (os.cpu_count() or 1) // instance_count(config)),
            ),
            inter_op_threads=int_parameter(config, "inter_op_thread_count", 0),
            parallel_execution=int_parameter(config, "execution_mode", 0) == 1,
            graph_level=config.optimization.graph.level if config.HasField("optimization") else 0,
        )
    except ConfigError as e:
        raise OptimizeError(str(e)) from None
    if fmt == ONNX:
        inputs, outputs, max_batch = _onnx_signature(model_file, config, has_config)
    else:
        if not config.input or not config.output:
            raise OptimizeError(f"{where}: a PyTorch model needs its inputs and outputs declared")
        inputs = [_config_tensor(t, where) for t in config.input]
        outputs = [_config_tensor(t, where) for t in config.output]
        max_batch = int(config.max_batch_size)
    return OriginalModel(
        name=name,
        repository=repository,
        model_dir=model_dir,
        version=version,
        versions=versions,
        model_file=model_file,
        format=fmt,
        config=config,
        has_config=has_config,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch,
        runtime=runtime,
    )


def _format(name: str, config: mc.ModelConfig, version_dir: Path) -> str:
    backend = backend_name(config)
    if not backend:  # no config naming one: the model file decides, as for the server
        if (version_dir / "model.onnx").is_file():
            backend = "onnxruntime"
        elif any((version_dir / f).is_file() for f in ("model.pt", "model.pt2")):
            backend = "pytorch"
        elif (version_dir / "model.py").is_file():
            backend = "python"
    if backend == "onnxruntime":
        return ONNX
    if backend == "pytorch":
        return TORCH_EXPORT if (version_dir / "model.pt2").is_file() else TORCHSCRIPT
    served = f"the {backend} backend" if backend else "no backend inferd recognises"
    raise OptimizeError(
        f"{name}: unsupported backend: the model uses {served}; inferd optimize takes ONNX "
        "(onnxruntime) and PyTorch (TorchScript model.pt, torch.export model.pt2) models"
    )


def _config_tensor(t: mc.ModelInput | mc.ModelOutput, where: str) -> TensorSpec:
    datatype = mc.DataType.Name(t.data_type).removeprefix("TYPE_")
    dtype = np.dtype(triton_to_np_dtype("BYTES" if datatype == "STRING" else datatype))
    if dtype.kind not in "biuf":
        raise OptimizeError(f"{where}: tensor '{t.name}' is {datatype}: only numeric tensors")
    dims = tuple(int(d) for d in (t.reshape.shape if t.HasField("reshape") else t.dims))
    return TensorSpec(t.name, dtype, dims)


def _onnx_signature(
    path: Path, config: mc.ModelConfig, has_config: bool
) -> tuple[list[TensorSpec], list[TensorSpec], int]:
    """The file's own tensors (what the session is fed); max_batch_size from the config, or
    Triton's completion rule when there is no config."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types for a bad file
        raise OptimizeError(f"{path}: ONNX Runtime cannot load it: {e}") from None
    tensors = {"input": session.get_inputs(), "output": session.get_outputs()}
    if has_config and config.max_batch_size >= 0:
        max_batch = int(config.max_batch_size)
    else:
        every = [t for group in tensors.values() for t in group]
        variable_first = all(t.shape and not isinstance(t.shape[0], int) for t in every)
        max_batch = AUTO_MAX_BATCH_SIZE if variable_first else 0
    if not has_config:
        config.max_batch_size = max_batch
    declared = {t.name: t for t in [*config.input, *config.output]}
    specs: dict[str, list[TensorSpec]] = {}
    for kind, group in tensors.items():
        specs[kind] = []
        for t in group:
            if t.type not in ORT_TYPES:
                raise OptimizeError(f"{path}: {kind} '{t.name}' is {t.type}: only numeric tensors")
            shape = [d if isinstance(d, int) and d > 0 else -1 for d in t.shape]
            dims = shape[1:] if max_batch > 0 else shape
            known = declared.get(t.name)
            if known is not None and len(known.dims) == len(dims):
                # The config may fix a dimension the file leaves variable.
                dims = [d if d > 0 else int(c) for d, c in zip(dims, known.dims, strict=True)]
            specs[kind].append(TensorSpec(t.name, np.dtype(ORT_TYPES[t.type]), tuple(dims)))
    return specs["input"], specs["output"], max_batch
