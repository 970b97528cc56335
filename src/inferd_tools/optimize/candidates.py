"""The candidates: each one a model file built from the original in a work directory.

ONNX models: ONNX Runtime's offline graph optimisation, dynamic and static (QDQ,
per-channel, calibrated) INT8 quantisation, and FP16 with inputs and outputs kept in their
types. PyTorch models: torch's dynamic INT8 quantisation of Linear layers (TorchScript) and
the export to ONNX. A candidate that cannot be built raises CandidateError with the reason.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd_tools.optimize.data import Dataset
from inferd_tools.optimize.runners import TorchRunner, session_options, tensor_order
from inferd_tools.optimize.source import MODEL_FILE, ONNX, TORCH_EXPORT, TORCHSCRIPT, OriginalModel

GRAPH = "graph"
INT8_DYNAMIC = "int8-dynamic"
INT8_STATIC = "int8-static"
FP16 = "fp16"
ONNX_EXPORT = "onnx-export"
KINDS = (GRAPH, INT8_DYNAMIC, INT8_STATIC, FP16, ONNX_EXPORT)
DEFAULT_TRIES = {
    ONNX: [GRAPH, INT8_DYNAMIC, INT8_STATIC, FP16],
    TORCHSCRIPT: [INT8_DYNAMIC, ONNX_EXPORT],
    TORCH_EXPORT: [INT8_DYNAMIC, ONNX_EXPORT],
}
ONNX_OPSET = 17
CALIBRATION_BATCH = 32  # rows per calibration feed (fewer when max_batch_size is smaller)


class CandidateError(Exception):
    """The candidate could not be built; the message says why."""


@dataclass(frozen=True)
class Built:
    name: str
    path: Path
    format: str  # the model file's format (a source format name)
    description: str


def build(name: str, model: OriginalModel, workdir: Path, calibration: Dataset) -> Built:
    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    builders: dict[str, dict[str, Callable[[OriginalModel, Path, Dataset], Built]]] = {
        ONNX: {GRAPH: _graph, INT8_DYNAMIC: _onnx_dynamic, INT8_STATIC: _onnx_static, FP16: _fp16},
        TORCHSCRIPT: {INT8_DYNAMIC: _torch_dynamic, ONNX_EXPORT: _torch_export_onnx},
        TORCH_EXPORT: {INT8_DYNAMIC: _program_dynamic, ONNX_EXPORT: _torch_export_onnx},
    }
    builder = builders[model.format].get(name)
    if builder is None:
        if model.format == ONNX:
            raise CandidateError(f"{name} applies to PyTorch models; the model is ONNX already")
        raise CandidateError(
            f"{name} applies to ONNX models; for a PyTorch model try {ONNX_EXPORT}, then "
            "optimise the exported file as an ONNX model of its own"
        )
    try:
        with _quiet_libraries():
            return builder(model, out, calibration)
    except CandidateError:
        raise
    except Exception as e:  # the quantisers and exporters raise anything; report, skip
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CandidateError(f"{type(e).__name__}: {first}"[:500]) from None


@contextmanager
def _quiet_libraries() -> Iterator[None]:
    """The quantisers log advice at INFO/WARNING through the root logger, and torch warns
    that its quantisation and TorchScript exporter are deprecated: neither is the user's
    concern while a candidate is built (a failure is reported with its reason)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        root.setLevel(level)


def _graph(model: OriginalModel, out: Path, _: Dataset) -> Built:
    import onnxruntime as ort

    path = out / MODEL_FILE[ONNX]
    options = session_options(model.runtime)
    # EXTENDED, not ALL: ALL adds layout rewrites tied to this machine's CPU, and the file
    # may be served elsewhere (ONNX Runtime's advice for offline optimisation).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(str(model.model_file), options, providers=["CPUExecutionProvider"])
    return Built(GRAPH, path, ONNX, "ONNX Runtime offline graph optimisation (extended)")


def _onnx_dynamic(model: OriginalModel, out: Path, _: Dataset) -> Built:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = out / MODEL_FILE[ONNX]
    quantize_dynamic(str(model.model_file), str(path), weight_type=QuantType.QInt8)
    return Built(INT8_DYNAMIC, path, ONNX, "INT8 weights, activations quantised at run time")


def _onnx_static(model: OriginalModel, out: Path, calibration: Dataset) -> Built:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = out / "preprocessed.onnx"
    try:  # shape inference and folding first, as onnxruntime advises; optional
        quant_pre_process(str(model.model_file), str(source), skip_symbolic_shape=True)
    except Exception:
        source = model.model_file
    path = out / MODEL_FILE[ONNX]
    size = min(CALIBRATION_BATCH, max(1, model.max_batch_size))
    feeds = iter(list(calibration.batches(size, model.batched)))

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(feeds, None)

    quantize_static(
        str(source), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True
    )
    return Built(
        INT8_STATIC, path, ONNX, f"INT8 QDQ, per-channel, calibrated on {calibration.rows} samples"
    )


def _fp16(model: OriginalModel, out: Path, _: Dataset) -> Built:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    path = out / MODEL_FILE[ONNX]
    converted = convert_float_to_float16(onnx.load(str(model.model_file)), keep_io_types=True)
    onnx.save(converted, str(path))
    return Built(FP16, path, ONNX, "FP16 weights and compute, inputs and outputs as before")


def _torch_dynamic(model: OriginalModel, out: Path, _: Dataset) -> Built:
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic_jit

    module = torch.jit.load(str(model.model_file), map_location="cpu")  # type: ignore[no-untyped-call]
    module.eval()
    # TorchScript has no eager modules to swap: graph-mode quantisation rewrites the
    # scripted graph's linear calls (LSTM and other layers stay in float).
    quantized = quantize_dynamic_jit(module, {"": per_channel_dynamic_qconfig})  # type: ignore[no-untyped-call]
    if "quantized::" not in str(quantized.inlined_graph):
        raise CandidateError("the model has no Linear layer that dynamic quantisation handles")
    path = out / MODEL_FILE[TORCHSCRIPT]
    torch.jit.save(quantized, str(path))
    return Built(INT8_DYNAMIC, path, TORCHSCRIPT, "torch dynamic INT8 of Linear layers")


def _program_dynamic(model: OriginalModel, out: Path, _: Dataset) -> Built:
    raise CandidateError(
        "a torch.export program has no eager Linear modules to quantise, and its pt2e "
        "quantisation flow lives in torchao, which inferd does not install; quantise the "
        "eager model before torch.export, or try onnx-export"
    )


def _torch_export_onnx(model: OriginalModel, out: Path, data: Dataset) -> Built:
    import torch

    runner = TorchRunner(model.model_file, model, exported=model.format == TORCH_EXPORT)
    feed = data.feed(min(2, max(1, model.max_batch_size)), model.batched)
    args = tuple(torch.from_numpy(feed[name]) for name in runner.inputs)
    outputs = [t.name for t in model.outputs]
    # The names in the order forward returns them (OUTPUT__<index> names say their place).
    returned = [outputs[i] for i in np.argsort(_returned_positions(outputs))]
    batch_axis = {name: {0: "batch"} for name in [*runner.inputs, *outputs]}
    path = out / MODEL_FILE[ONNX]
    if model.format == TORCH_EXPORT:
        import importlib.util

        if importlib.util.find_spec("onnxscript") is None:
            raise CandidateError(
                "exporting a torch.export program to ONNX needs torch's dynamo exporter, "
                "which needs onnxscript (pip install onnxscript)"
            )
        program = torch.export.load(str(model.model_file))
        torch.onnx.export(
            program, args, str(path), input_names=runner.inputs, output_names=returned,
            dynamo=True,
        )  # fmt: skip
    else:
        torch.onnx.export(
            runner.module,
            args,
            str(path),
            input_names=runner.inputs,
            output_names=returned,
            dynamic_axes=batch_axis if model.batched else None,
            opset_version=ONNX_OPSET,
            dynamo=False,  # the dynamo exporter takes no ScriptModule
        )
    return Built(ONNX_EXPORT, path, ONNX, "the model exported to ONNX (torch.onnx.export)")


def _returned_positions(outputs: list[str]) -> list[int]:
    return tensor_order(outputs, []) or list(range(len(outputs)))
