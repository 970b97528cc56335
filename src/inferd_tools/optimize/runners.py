"""Run a model file in process the way the server's instance would: ONNX Runtime with the
config's thread counts, execution mode and graph level, or torch with its thread count."""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inferd_tools.optimize.source import ONNX, TORCH_EXPORT, OriginalModel, RuntimeSettings

# Triton's optimization.graph.level values (as the server maps them); others: all.
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
_INDEXED = re.compile(r".*__(\d+)$")  # Triton's INPUT__0 / OUTPUT__0 naming


class Runner(Protocol):
    load_s: float

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def session_options(runtime: RuntimeSettings) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = runtime.intra_op_threads
    options.inter_op_num_threads = runtime.inter_op_threads
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL
        if runtime.parallel_execution
        else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    level = _GRAPH_LEVELS.get(runtime.graph_level, "ORT_ENABLE_ALL")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return options


class OnnxRunner:
    def __init__(self, path: Path, runtime: RuntimeSettings) -> None:
        import onnxruntime as ort

        started = time.perf_counter()
        self._session = ort.InferenceSession(
            str(path), session_options(runtime), providers=["CPUExecutionProvider"]
        )
        self.load_s = time.perf_counter() - started
        self._outputs = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self._session.run(self._outputs, feeds), strict=True))


def tensor_order(names: list[str], arguments: list[str]) -> list[int] | None:
    """Each name's position: Triton's `__<index>` suffixes when every name has one, else the
    name's place among `arguments`; None when a name is neither."""
    indexes = [_INDEXED.match(n) for n in names]
    if all(indexes):
        return [int(m.group(1)) for m in indexes if m]
    if arguments and all(n in arguments for n in names):
        return [arguments.index(n) for n in names]
    return None


class TorchRunner:
    """A TorchScript (model.pt) or torch.export (model.pt2) module; inputs fed in forward's
    order and outputs named as the server names them (config order or OUTPUT__<index>)."""

    def __init__(self, path: Path, model: OriginalModel, exported: bool) -> None:
        import torch

        torch.set_num_threads(model.runtime.intra_op_threads)
        started = time.perf_counter()
        with warnings.catch_warnings():
            # TorchScript's deprecation notice, every load: not the user's concern here.
            warnings.simplefilter("ignore", DeprecationWarning)
            if exported:
                program = torch.export.load(str(path))
                self._module: Any = program.module()
                arguments = [
                    s.arg.name
                    for s in program.graph_signature.input_specs
                    if s.kind.name == "USER_INPUT"
                ]
            else:
                self._module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
                self._module.eval()
                arguments = [a.name for a in self._module.forward.schema.arguments[1:]]
        self.load_s = time.perf_counter() - started
        inputs = [t.name for t in model.inputs]
        order = tensor_order(inputs, arguments) or list(range(len(inputs)))
        self.inputs = [name for _, name in sorted(zip(order, inputs, strict=True))]
        outputs = [t.name for t in model.outputs]
        self._output_index = tensor_order(outputs, []) or list(range(len(outputs)))
        self._outputs = outputs

    @property
    def module(self) -> Any:
        return self._module

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in self.inputs]
        with torch.inference_mode():
            result = self._module(*args)
        results = [result] if isinstance(result, torch.Tensor) else list(result)
        return {
            name: results[index].detach().cpu().numpy()
            for name, index in zip(self._outputs, self._output_index, strict=True)
        }


def open_runner(path: Path, fmt: str, model: OriginalModel) -> Runner:
    if fmt == ONNX:
        return OnnxRunner(path, model.runtime)
    return TorchRunner(path, model, exported=fmt == TORCH_EXPORT)
