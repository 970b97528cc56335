"""Stateful models for the sequence-batching tests, built by the tests themselves.

Each one answers a step of a sequence with the running sum of the values its sequence sent
so far, keeping that sum a different way: in the model keyed by the CORRID control (inferd's
Python API), keyed by `correlation_id()` (a Triton Python-backend model), or as implicit
state kept by the server (an ONNX graph, and a Python model that also reports its slot).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tests.support.models import builders

# inferd's API: the sum per correlation id lives in the model (a dict per instance), which
# is only right if every request of a sequence reaches the same instance, in order. It
# also checks that the CORRID/START/END controls agree with the requests' infos.
ACC_PY = """
import numpy as np
from inferd import SEQUENCE_END, SEQUENCE_START

class Model:
    def load(self, context):
        self.sums = {}

    def predict(self, inputs, requests):
        x = inputs["IN"][:, 0]
        start, end, corrid = inputs["START"][:, 0], inputs["END"][:, 0], inputs["CORRID"][:, 0]
        out = np.zeros((len(x), 1), dtype=np.float32)
        for i, info in enumerate(requests):
            cid = int(corrid[i])
            assert cid == info.correlation_id(), (cid, info.correlation_id())
            assert bool(start[i]) == bool(info.flags() & SEQUENCE_START), (start[i], info.flags())
            assert bool(end[i]) == bool(info.flags() & SEQUENCE_END), (end[i], info.flags())
            total = (0.0 if start[i] else self.sums[cid]) + float(x[i])
            self.sums[cid] = total
            if end[i]:
                del self.sums[cid]
            out[i, 0] = total
        return {"OUT": out}
"""

ACC_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: 2, kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  oldest {{ max_candidate_sequences: 4 }}
  control_input [
    {{ name: "START", control [ {{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END", control [ {{ kind: CONTROL_SEQUENCE_END, fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID", control [ {{ kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""

# Triton's contract: the sum per correlation_id(), reset on flags() START. String ids.
ACC_TRITON_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            if not ready.all():  # a filler row (direct strategy): answer it with anything
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
                continue
            cid = request.correlation_id()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            # (0 during warm-up: a one-step sequence without an id)
            assert corrid.ravel()[0] == (cid.encode() if cid else b""), (corrid, cid)
            flags = request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[cid] = 0.0
            self.sums[cid] += float(x.ravel()[0])
            out = np.full(x.shape, self.sums[cid], dtype=np.float32)
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[cid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

ACC_TRITON_CONFIG = """
name: "acc_triton"
backend: "python"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
sequence_batching {
  direct { }
  control_input [
    { name: "READY",
      control [ { kind: CONTROL_SEQUENCE_READY, bool_false_true: [ false, true ] } ] },
    { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_STRING } ] }
  ]
}
"""

# Implicit state on ONNX: STATE_OUT = IN + STATE_IN * (1 - START); OUT = STATE_OUT.
ACC_ONNX_CONFIG = """
name: "acc_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
sequence_batching {
  direct { }
  control_input [
    { name: "START", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ {
    input_name: "STATE_IN"
    output_name: "STATE_OUT"
    data_type: TYPE_FP32
    dims: [ 1 ]
    initial_state: { data_type: TYPE_FP32, dims: [ 1 ], zero_data: true, name: "zero" }
  } ]
}
"""

# Implicit state on a Python model, which also reports where each request ran: its batch
# row (the slot, under the direct strategy) and its instance.
SLOTS_PY = """
import numpy as np

class Model:
    def load(self, context):
        self.instance = context.instance_index

    def predict(self, inputs):
        x, state = inputs["IN"], inputs["STATE_IN"]
        total = state + x
        n = x.shape[0]
        return {
            "OUT": total,
            "STATE_OUT": total,
            "ROW": np.arange(n, dtype=np.int64).reshape(n, 1),
            "INSTANCE": np.full((n, 1), self.instance, dtype=np.int64),
            "READY": inputs["READY"].astype(np.int32),
        }
"""

SLOTS_CONFIG = """
name: "slots"
backend: "python"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_INT64, dims: [ 1 ] } ]
output [
  { name: "OUT", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "ROW", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "INSTANCE", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "READY", data_type: TYPE_INT32, dims: [ 1 ] }
]
instance_group [ { count: 2, kind: KIND_CPU } ]
sequence_batching {
  direct { }
  control_input [
    { name: "READY", control [ { kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "STATE_IN", output_name: "STATE_OUT", data_type: TYPE_INT64, dims: [ 1 ] } ]
}
"""

# A model that does not batch (max_batch_size 0): control inputs of shape [1], the state
# without a batch dimension, one request per execution.
UNBATCHED_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "S_IN").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            assert corrid.shape == (1,) and corrid[0] == request.correlation_id(), corrid
            total = x + state
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", total), pb_utils.Tensor("S_OUT", total)]
            ))
        return responses
"""

UNBATCHED_CONFIG = """
name: "acc_unbatched"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]
sequence_batching {
  control_input [
    { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_INT64 } ] }
  ]
  state [ { input_name: "S_IN", output_name: "S_OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]
}
"""

# A plain (not sequence) model, for the parameter checks.
PLAIN_CONFIG = """
name: "plain"
backend: "python"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

PLAIN_PY = """
class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"]}
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def accumulator_onnx() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["START"], ["start_f"], to=f),
            helper.make_node("Sub", ["one", "start_f"], ["keep"]),
            helper.make_node("Mul", ["STATE_IN", "keep"], ["carried"]),
            helper.make_node("Add", ["IN", "carried"], ["STATE_OUT"]),
            helper.make_node("Identity", ["STATE_OUT"], ["OUT"]),
        ],
        "accumulator",
        [
            helper.make_tensor_value_info("IN", f, ["batch", 1]),
            helper.make_tensor_value_info("START", TensorProto.INT32, ["batch", 1]),
            helper.make_tensor_value_info("STATE_IN", f, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("OUT", f, ["batch", 1]),
            helper.make_tensor_value_info("STATE_OUT", f, ["batch", 1]),
        ],
        initializer=[helper.make_tensor("one", f, [], [1.0])],
    )
    model: onnx.ModelProto = builders._ir(graph)
    return model


def build_sequence_repository(repo: Path, idle_us: int = 60_000_000) -> None:
    """acc (inferd Python API, oldest), acc_triton (Triton Python, direct, string ids),
    acc_onnx (ONNX, implicit state, direct), slots (Python, implicit state), acc_unbatched
    (Triton Python, implicit state, max_batch_size 0), plain."""
    _write(repo / "acc" / "config.pbtxt", ACC_CONFIG.format(name="acc", idle_us=idle_us))
    _write(repo / "acc" / "1" / "model.py", ACC_PY)
    _write(repo / "acc_triton" / "config.pbtxt", ACC_TRITON_CONFIG)
    _write(repo / "acc_triton" / "1" / "model.py", ACC_TRITON_PY)
    _write(repo / "acc_onnx" / "config.pbtxt", ACC_ONNX_CONFIG)
    builders._save(accumulator_onnx(), repo / "acc_onnx" / "1" / "model.onnx")
    _write(repo / "slots" / "config.pbtxt", SLOTS_CONFIG)
    _write(repo / "slots" / "1" / "model.py", SLOTS_PY)
    _write(repo / "acc_unbatched" / "config.pbtxt", UNBATCHED_CONFIG)
    _write(repo / "acc_unbatched" / "1" / "model.py", UNBATCHED_PY)
    _write(repo / "plain" / "config.pbtxt", PLAIN_CONFIG)
    _write(repo / "plain" / "1" / "model.py", PLAIN_PY)


def write_process_accumulator(repo: Path, name: str = "acc_process") -> None:
    """`acc` in a worker process of its own (isolation: process)."""
    config = ACC_CONFIG.format(name=name, idle_us=60_000_000)
    config += 'parameters { key: "isolation" value: { string_value: "process" } }\n'
    _write(repo / name / "config.pbtxt", config)
    _write(repo / name / "1" / "model.py", ACC_PY)


def write_process_triton_accumulator(repo: Path, name: str = "acc_triton_process") -> None:
    """`acc_triton` in a worker process of its own (isolation: process)."""
    config = ACC_TRITON_CONFIG.replace('name: "acc_triton"', f'name: "{name}"')
    config += 'parameters { key: "isolation" value: { string_value: "process" } }\n'
    _write(repo / name / "config.pbtxt", config)
    _write(repo / name / "1" / "model.py", ACC_TRITON_PY)


def write_short_idle(repo: Path, name: str, idle_us: int) -> None:
    """An `acc` model whose sequences are released after `idle_us` without a request."""
    _write(repo / name / "config.pbtxt", ACC_CONFIG.format(name=name, idle_us=idle_us))
    _write(repo / name / "1" / "model.py", ACC_PY)
