"""ONNX Runtime backend: Triton's `onnxruntime_onnx` platform, parameters and auto-complete."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends import onnx_bf16 as bf16_session
from inferd.backends.base import LoadContext
from inferd.config.model_config import ConfigError, instance_group_of
from inferd.types import Array

log = logging.getLogger("inferd.backends.onnx")

ORT_TO_CONFIG = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(bfloat16)": mc.TYPE_BF16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING,
}

# Triton's `optimization { graph { level } }` values; anything else keeps ORT_ENABLE_ALL.
GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}

# Triton's core default for auto-completed batching models (--default-max-batch-size).
DEFAULT_MAX_BATCH_SIZE = 4


def _dim(d: Any) -> int:
    return d if isinstance(d, int) and d > 0 else -1


class OnnxBackend:
    model_file = "model.onnx"
    model_files: tuple[str, ...] = ("model.onnx",)
    decodes_bytes_as_text = True

    def complete_config(self, config: mc.ModelConfig, version_dir: Path) -> None:
        where = f"{config.name}/config.pbtxt"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(
            str(version_dir / self.model_file), options, providers=["CPUExecutionProvider"]
        )
        ins = [(t.name, t.type, [_dim(d) for d in t.shape]) for t in session.get_inputs()]
        outs = [(t.name, t.type, [_dim(d) for d in t.shape]) for t in session.get_outputs()]
        for name, typ, _ in ins + outs:
            if typ not in ORT_TO_CONFIG:
                raise ConfigError(f"{where}: tensor '{name}' has unsupported ONNX type {typ}")
        # Tensors the server feeds or keeps itself (sequence control inputs, implicit
        # state) are not the client's: auto-completion leaves them out of input/output.
        fed, kept = _sequence_tensors(config)
        model_inputs = {name for name, _, _ in ins}
        if missing := sorted(fed - model_inputs):
            raise ConfigError(
                f"{where}: sequence_batching names input '{missing[0]}' (a control or state "
                f"input), which the model file does not have; it has "
                f"{', '.join(sorted(model_inputs))}"
            )
        model_outputs = {name for name, _, _ in outs}
        if missing := sorted(kept - model_outputs):
            raise ConfigError(
                f"{where}: sequence_batching.state output_name '{missing[0]}' is not an output "
                f"of the model file; it has {', '.join(sorted(model_outputs))}"
            )
        # Batch inputs too are the server's: checked against the model file, never completed.
        targets = _check_batch_inputs(where, config, ins)
        ins = [t for t in ins if t[0] not in fed and t[0] not in targets]

        if not config.input and not config.output:
            # Batching is possible only if every tensor has a variable leading dimension.
            can_batch = all(len(s) >= 1 and s[0] == -1 for _, _, s in ins + outs)
            if config.max_batch_size == 0 and can_batch:
                config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
            if config.max_batch_size > 0 and not can_batch:
                raise ConfigError(
                    f"{where}: max_batch_size is {config.max_batch_size} but the model's "
                    "tensors have no variable leading (batch) dimension"
                )
            # (Setting dynamic_batching would clear sequence_batching: they are a oneof.)
            scheduled = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
            if config.max_batch_size > 1 and not scheduled:
                config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        for kind, declared, actual in (
            ("input", config.input, ins),
            ("output", config.output, outs),
        ):
            by_name = {name: (typ, shape) for name, typ, shape in actual}
            if not declared:
                for name, typ, shape in actual:
                    if kind == "output" and name in kept:
                        continue  # a state output: the server keeps it
                    t = declared.add()
                    t.name = name
                    t.data_type = ORT_TO_CONFIG[typ]
                    t.dims.extend(shape[skip:] or [1])
                continue
            for t in declared:
                if t.name not in by_name:
                    raise ConfigError(
                        f"{where}: {kind} '{t.name}' is not in the model file; it has "
                        f"{', '.join(by_name)}"
                    )
                typ, shape = by_name[t.name]
                if ORT_TO_CONFIG[typ] != t.data_type:
                    raise ConfigError(
                        f"{where}: {kind} '{t.name}': data_type "
                        f"{mc.DataType.Name(t.data_type)} does not match the model file's "
                        f"{mc.DataType.Name(ORT_TO_CONFIG[typ])}"
                    )
                if isinstance(t, mc.ModelInput) and t.allow_ragged_batch:
                    _check_ragged(f"{where}: {kind} '{t.name}'", shape)
                else:
                    _check_dims(f"{where}: {kind} '{t.name}'", t, shape, config.max_batch_size)

    def load(self, ctx: LoadContext) -> OnnxInstance:
        return OnnxInstance(ctx)


def _check_dims(field: str, t: mc.ModelInput | mc.ModelOutput, shape: list[int], mbs: int) -> None:
    """The config's dims (its `reshape`, when set: that is what the model sees) against the
    model file's shape (-1: any size), as Triton checks them: a mismatch found here is one
    line naming the field, instead of ONNX Runtime's "invalid dimensions" at the first run."""
    declared = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
    what = "reshape.shape" if t.HasField("reshape") else "dims"
    if any(d < -1 or d == 0 for d in declared):
        return  # malformed whatever the model file says: `validate` names it
    if mbs > 0 and (not shape or shape[0] != -1):
        raise ConfigError(
            f"{field}: max_batch_size {mbs} needs a variable first (batch) dimension, but the "
            f"model file's shape is {shape}; set max_batch_size: 0 and declare the whole "
            "shape in dims, or export the model with a dynamic batch dimension"
        )
    model_dims = shape[1:] if mbs > 0 else shape
    batch_note = f" after the batch dimension (max_batch_size {mbs})" if mbs > 0 else ""
    if len(model_dims) != len(declared):
        raise ConfigError(
            f"{field}: {what} {declared} have {len(declared)} dimensions, but the model "
            f"file's shape {shape} has {len(model_dims)}{batch_note}"
        )
    for axis, (size, want) in enumerate(zip(model_dims, declared, strict=True)):
        if size != -1 and size != want:
            raise ConfigError(
                f"{field}: {what} {declared} do not match the model file's shape {shape}: "
                f"dimension {axis}{batch_note} is {size} in the model file but {want} in the "
                "config"
            )


def _check_ragged(field: str, shape: list[int]) -> None:
    """Triton's rule: a ragged input reaches the model as one flat dimension."""
    if shape != [-1]:
        raise ConfigError(
            f"{field}: allow_ragged_batch: the model file's shape is {shape}, but a ragged "
            "input reaches the model as the batch's values concatenated in one dimension, so "
            "the model must take shape [-1]"
        )


def _check_batch_inputs(
    where: str, config: mc.ModelConfig, ins: list[tuple[str, str, list[int]]]
) -> set[str]:
    """Each batch input's target is an input of the model file, of its data type and rank;
    returns the target names."""
    by_name = {name: (typ, shape) for name, typ, shape in ins}
    targets: set[str] = set()
    for entry in config.batch_input:
        rank = 2 if entry.kind == mc.BatchInput.BATCH_ITEM_SHAPE else 1
        for target in entry.target_name:
            targets.add(target)
            field = f"{where}: batch_input target_name '{target}'"
            if target not in by_name:
                raise ConfigError(
                    f"{field}: the model file has no such input; it has "
                    f"{', '.join(by_name) or '(none)'}"
                )
            typ, shape = by_name[target]
            if ORT_TO_CONFIG[typ] != entry.data_type:
                raise ConfigError(
                    f"{field}: data_type {mc.DataType.Name(entry.data_type)} does not match "
                    f"the model file's {mc.DataType.Name(ORT_TO_CONFIG[typ])}"
                )
            if len(shape) != rank:
                kind = mc.BatchInput.Kind.Name(entry.kind)
                raise ConfigError(
                    f"{field}: {kind} is a tensor of {rank} dimension{'s' if rank > 1 else ''}, "
                    f"but the model file's shape is {shape}"
                )
    return targets


class OnnxInstance:
    def __init__(self, ctx: LoadContext) -> None:
        config = ctx.config
        settings = ctx.backend_settings()
        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.intra_op_threads(ctx.instance_count)
        options.inter_op_num_threads = settings.inter_op_thread_count
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL
            if settings.parallel_execution
            else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        level = config.optimization.graph.level if config.HasField("optimization") else 0
        options.graph_optimization_level = GRAPH_LEVELS.get(
            level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )

        group, _, index_in_group = instance_group_of(config, ctx.instance_index)
        kind = group.kind
        gpus = list(group.gpus)
        device_id = gpus[index_in_group % len(gpus)] if gpus else 0
        wants_gpu = kind in (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO)
        has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
        providers: list[Any] = ["CPUExecutionProvider"]
        if wants_gpu and has_cuda:
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device_id}))
        self._session = ort.InferenceSession(
            str(ctx.version_dir / OnnxBackend.model_file), options, providers=providers
        )
        active = self._session.get_providers()
        self.device = f"cuda:{device_id}" if "CUDAExecutionProvider" in active else "cpu"
        if kind == mc.ModelInstanceGroup.KIND_GPU and self.device == "cpu":
            # Field lesson 5: a silent fall back to CPU must be visible.
            log.warning(
                "model %s v%s instance %d asked for KIND_GPU but CUDAExecutionProvider is "
                "not active (available: %s); running on CPU (the config API reports KIND_CPU)",
                ctx.model_name,
                ctx.version,
                ctx.instance_index,
                ", ".join(ort.get_available_providers()),
            )
        self.providers = active
        self.provider = active[0]  # the one that runs the graph (CPU takes what it can't)
        log.info(
            "model %s version %s instance %d: ONNX Runtime providers %s, %d intra-op threads",
            ctx.model_name,
            ctx.version,
            ctx.instance_index,
            ", ".join(active),
            options.intra_op_num_threads,
        )
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._string_inputs = {
            i.name for i in self._session.get_inputs() if i.type == "tensor(string)"
        }
        tensors = self._session.get_inputs() + self._session.get_outputs()
        self._bf16 = (
            bf16_session.BFloat16Run(self._session, f"{ctx.model_name}/config.pbtxt")
            if any(t.type == bf16_session.ONNX_TYPE for t in tensors)
            else None
        )

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        if self._string_inputs:
            inputs = dict(inputs)
            for name in self._string_inputs & inputs.keys():
                inputs[name] = np.vectorize(_to_str, otypes=[object])(inputs[name])
        if self._bf16 is not None:
            return self._bf16.run(self._output_names, inputs)
        results = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, results, strict=True))

    def close(self) -> None:
        self.__dict__.pop("_session", None)  # idempotent: closing twice is harmless


def _sequence_tensors(config: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """(inputs the server feeds, outputs it keeps) of a sequence model's config."""
    if not config.HasField("sequence_batching"):
        return set(), set()
    sb = config.sequence_batching
    fed = {c.name for c in sb.control_input} | {s.input_name for s in sb.state}
    return fed, {s.output_name for s in sb.state}


def _to_str(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
