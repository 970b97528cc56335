"""Models for the ragged batching tests: each sums every request's values of a ragged input,
finding the requests in the flat batch through a batch input (docs/batching.md)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import builders

RAGGED_ONNX = "ragged_sum_onnx"  # work-conserving: a lone request runs at once
# The same model whose batches wait (Triton's window) until 4 requests are queued: an ONNX
# model cannot be held by a gate, so the queue decides what its one batch holds.
RAGGED_ONNX_WINDOW = "ragged_sum_onnx_window"
RAGGED_PY = "ragged_sum_py"  # inferd's Model API, gated
RAGGED_TRITON_PY = "ragged_sum_triton_py"  # TritonPythonModel, gated

_INPUT = """
input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
batch_input [
  {
    kind: BATCH_ACCUMULATED_ELEMENT_COUNT
    target_name: "INDEX"
    data_type: TYPE_INT32
    source_input: "INPUT"
  }
]
"""

ONNX_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
output [ {{ name: "SUM", data_type: TYPE_FP32, dims: [ 1 ] }} ]
{extra}
""" + _INPUT.replace("{", "{{").replace("}", "}}")

WINDOW = """
dynamic_batching { preferred_batch_size: [ 4 ], max_queue_delay_microseconds: 60000000 }
parameters { key: "batching_policy" value: { string_value: "window" } }
"""


def ragged_sum() -> onnx.ModelProto:
    """SUM[i] = the sum of request i's values: a running sum of the flat INPUT, read at
    each request's end (INDEX) minus at its start (the previous end, 0 for the first)."""
    nodes = [
        helper.make_node("CumSum", ["INPUT", "axis0"], ["running"]),
        helper.make_node("Concat", ["zero_f", "running"], ["running0"], axis=0),
        helper.make_node("Concat", ["zero_i", "INDEX"], ["bounds"], axis=0),
        helper.make_node("Slice", ["bounds", "first", "last"], ["starts"]),
        helper.make_node("Gather", ["running0", "INDEX"], ["at_end"]),
        helper.make_node("Gather", ["running0", "starts"], ["at_start"]),
        helper.make_node("Sub", ["at_end", "at_start"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axis1"], ["SUM"]),
    ]
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "axis0"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.zeros(1, np.float32), "zero_f"),
        numpy_helper.from_array(np.zeros(1, np.int32), "zero_i"),
        numpy_helper.from_array(np.array([0], np.int64), "first"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged_sum",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["elements"]),
            helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["requests"]),
        ],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["requests", 1])],
        constants,
    )
    return builders._ir(graph)


# The blocker (a negative value) holds the instance while the file `gate_path` exists.
# EXEC numbers the executions; SEEN is the length of the flat INPUT the model received.
RAGGED_PY_CODE = """
import itertools, os, time
import numpy as np

class Model:
    def load(self, context):
        self.gate = context.parameters["gate_path"]
        self.ids = itertools.count(1)

    def predict(self, inputs):
        x, ends = inputs["INPUT"], inputs["INDEX"]
        if x.ndim != 1:
            raise ValueError(f"INPUT should be flat, got shape {x.shape}")
        if (x < 0).any():
            deadline = time.monotonic() + 60  # never hold the instance forever
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.002)
        running = np.concatenate([[0.0], np.cumsum(x, dtype=np.float64)])
        starts = np.concatenate([[0], ends[:-1]])
        n = len(ends)
        exec_id = next(self.ids)
        return {
            "SUM": (running[ends] - running[starts]).astype(np.float32).reshape(n, 1),
            "EXEC": np.full((n, 1), exec_id, dtype=np.int64),
            "SEEN": np.full((n, 1), x.size, dtype=np.int64),
        }
"""

# Triton's Python-backend contract: the requests arrive separately, each with its own shape.
RAGGED_TRITON_PY_CODE = """
import itertools, json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.gate = parameters["gate_path"]["string_value"]
        self.ids = itertools.count(1)

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        if any((x < 0).any() for x in xs):
            deadline = time.monotonic() + 60
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.002)
        exec_id = next(self.ids)
        responses = []
        for x in xs:
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", x.sum(axis=1, keepdims=True).astype(np.float32)),
                pb_utils.Tensor("EXEC", np.full((rows, 1), exec_id, dtype=np.int64)),
                pb_utils.Tensor("SEEN", np.full((rows, 1), x.size, dtype=np.int64)),
            ]))
        return responses
"""

PY_OUTPUTS = """
output [
  { name: "SUM", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "EXEC", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "SEEN", data_type: TYPE_INT64, dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching { }
"""


def write_ragged_models(repo: Path, gate: Path) -> None:
    for name, extra in ((RAGGED_ONNX, "dynamic_batching { }"), (RAGGED_ONNX_WINDOW, WINDOW)):
        builders._save(ragged_sum(), repo / name / "1" / "model.onnx")
        _write(repo / name / "config.pbtxt", ONNX_CONFIG.format(name=name, extra=extra))
    header = 'name: "{}"\nbackend: "python"\nmax_batch_size: 8\n'
    gate_parameter = f'parameters {{ key: "gate_path" value: {{ string_value: "{gate}" }} }}\n'
    _write(
        repo / RAGGED_PY / "config.pbtxt",
        header.format(RAGGED_PY) + _INPUT + PY_OUTPUTS + gate_parameter,
    )
    _write(repo / RAGGED_PY / "1" / "model.py", RAGGED_PY_CODE)
    # Triton's Python backend has no batch inputs: this model declares only the ragged input.
    _write(
        repo / RAGGED_TRITON_PY / "config.pbtxt",
        header.format(RAGGED_TRITON_PY)
        + 'input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ -1 ], '
        + "allow_ragged_batch: true } ]\n"
        + PY_OUTPUTS
        + gate_parameter,
    )
    _write(repo / RAGGED_TRITON_PY / "1" / "model.py", RAGGED_TRITON_PY_CODE)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
