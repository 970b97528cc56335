"""Build inferd's repository for the side-by-side runs: the same two models as the peers.

    .venv/bin/python benchmarks/peers/inferd_repo.py [OUT]      (default: results/inferd_repo)

tiny is an ONNX graph (Slice + Mul: OUTPUT = INPUT[:, :16] * 2); mlp is the same ONNX file the
peers load. Both batch up to 32 with a 2 ms bound, as the peers are configured; inferd's
default work-conserving policy never waits out that bound when it could execute.
mlp_nobatch is mlp without dynamic batching (what batching costs a lone request).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ {{ name: "{inp}", data_type: TYPE_FP32, dims: [ 64 ] }} ]
output [ {outputs} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""


def tiny_model() -> onnx.ModelProto:
    init = [
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([16], np.int64), "ends"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["INPUT", "starts", "ends", "axes"], ["head"]),
            helper.make_node("Mul", ["head", "two"], ["OUTPUT"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 16])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "inferd_repo"
    (out / "tiny" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_model(), str(out / "tiny" / "1" / "model.onnx"))
    (out / "tiny" / "config.pbtxt").write_text(
        CONFIG.format(
            name="tiny", inp="INPUT",
            outputs='{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 16 ] }',
        )
    )  # fmt: skip
    mlp_src = HERE / "results" / "models" / "mlp" / "1" / "model.onnx"
    if not mlp_src.exists():
        raise SystemExit(f"no {mlp_src}: run benchmarks/peers/setup.sh first")
    (out / "mlp" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mlp_src, out / "mlp" / "1" / "model.onnx")
    (out / "mlp" / "config.pbtxt").write_text(
        CONFIG.format(
            name="mlp", inp="input",
            outputs='{ name: "probabilities", data_type: TYPE_FP32, dims: [ 16 ] }, '
            '{ name: "label", data_type: TYPE_INT64, dims: [ 1 ] }',
        )
    )  # fmt: skip
    # The MLP with batching off (no dynamic_batching): the reference for what batching
    # costs a lone request (lone_request.sh).
    (out / "mlp_nobatch" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mlp_src, out / "mlp_nobatch" / "1" / "model.onnx")
    nobatch = (
        (out / "mlp" / "config.pbtxt").read_text().replace('name: "mlp"', 'name: "mlp_nobatch"')
    )
    nobatch = "".join(line for line in nobatch.splitlines(True) if "dynamic_batching" not in line)
    (out / "mlp_nobatch" / "config.pbtxt").write_text(nobatch)
    print(f"inferd repository in {out}")


if __name__ == "__main__":
    main()
