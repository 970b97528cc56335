"""Models for the padding tests (pad_inputs, docs/batching.md#padding): token ids and their
mask, of any length, batched together and padded to the batch's longest."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import builders

PAD_ONNX = "pad_mean_onnx"  # work-conserving, grouped by length (the default)
PAD_PY = "pad_py"  # inferd's Model API, gated: the queue decides what its batches hold
PAD_TRITON_PY = "pad_triton_py"  # execute(requests): refused at load

_INPUTS = """
input [
  { name: "ids", data_type: TYPE_INT64, dims: [ -1 ] },
  { name: "mask", data_type: TYPE_INT64, dims: [ -1 ] }
]
parameters { key: "pad_inputs" value: { string_value: "ids:0, mask:0" } }
parameters { key: "padded_outputs" value: { string_value: "hidden" } }
"""

ONNX_CONFIG = (
    f"""
name: "{PAD_ONNX}"
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
dynamic_batching {{ }}
output [
  {{ name: "mean", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "hidden", data_type: TYPE_FP32, dims: [ -1 ] }}
]
"""
    + _INPUTS
)


def masked_mean() -> onnx.ModelProto:
    """mean[i] = the mean of request i's ids where its mask is 1; hidden = ids * 2."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["idsf", "maskf"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axis1"], ["total"], keepdims=1),
        helper.make_node("ReduceSum", ["maskf", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["mean"]),
        helper.make_node("Mul", ["idsf", "two"], ["hidden"]),
    ]
    constants = [
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_mean",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [
            helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens"]),
        ],
        constants,
    )
    return builders._ir(graph)


# A request whose ids hold a negative value is the blocker: it holds the instance while the
# file `gate_path` exists. EXEC numbers the executions; WIDTH is the padded length the model
# received; REAL, the request's own length (its mask's ones).
PAD_PY_CODE = """
import itertools, os, time
import numpy as np

class Model:
    def load(self, context):
        self.gate = context.parameters["gate_path"]
        self.ids = itertools.count(1)

    def predict(self, inputs):
        ids, mask = inputs["ids"], inputs["mask"]
        if (ids < 0).any():
            deadline = time.monotonic() + 60  # never hold the instance forever
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.002)
        n, width = ids.shape
        exec_id = next(self.ids)
        return {
            "hidden": (ids * 2).astype(np.float32),
            "REAL": mask.sum(axis=1, keepdims=True).astype(np.int64),
            "WIDTH": np.full((n, 1), width, dtype=np.int64),
            "EXEC": np.full((n, 1), exec_id, dtype=np.int64),
        }
"""

PY_OUTPUTS = """
output [
  { name: "hidden", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "REAL", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "WIDTH", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "EXEC", data_type: TYPE_INT64, dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching { }
"""

TRITON_PY_CODE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


def write_padding_models(repo: Path, gate: Path) -> None:
    builders._save(masked_mean(), repo / PAD_ONNX / "1" / "model.onnx")
    _write(repo / PAD_ONNX / "config.pbtxt", ONNX_CONFIG)
    header = 'name: "{}"\nbackend: "python"\nmax_batch_size: 8\n'
    gate_parameter = f'parameters {{ key: "gate_path" value: {{ string_value: "{gate}" }} }}\n'
    _write(
        repo / PAD_PY / "config.pbtxt",
        header.format(PAD_PY) + _INPUTS + PY_OUTPUTS + gate_parameter,
    )
    _write(repo / PAD_PY / "1" / "model.py", PAD_PY_CODE)
    _write(
        repo / PAD_TRITON_PY / "config.pbtxt",
        header.format(PAD_TRITON_PY) + _INPUTS + PY_OUTPUTS,
    )
    _write(repo / PAD_TRITON_PY / "1" / "model.py", TRITON_PY_CODE)


def tokens(length: int, start: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One request's ids (start, start + 1, ...) and its all-ones mask, as [1, length]."""
    ids = np.arange(start, start + length, dtype=np.int64)[None]
    return ids, np.ones_like(ids)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
