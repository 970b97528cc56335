"""Models for the capture and feedback tests: y = c * x, with c = +1 or -1 per version, so
versions disagree on the class (argmax) of the same input; `cls` is that class, INT64."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import builders

SIGNED_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "cls", data_type: TYPE_INT64, dims: [ 1 ] }} ]
dynamic_batching {{ }}
{extra}
"""


def signed(c: float) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "c"], ["y"]),
            helper.make_node("ArgMax", ["y"], ["cls"], axis=1, keepdims=1),
        ],
        "signed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("cls", TensorProto.INT64, ["batch", 1]),
        ],
        [numpy_helper.from_array(np.full(4, c, np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def parameters(**values: object) -> str:
    """`parameters { ... }` entries of a config, from keyword arguments."""
    return "".join(
        f"parameters {{ key: \"{k}\" value: {{ string_value: '{v}' }} }}\n"
        for k, v in values.items()
    )


def write_signed_model(
    repo: Path, name: str, signs: dict[int, float] | None = None, extra: str = ""
) -> None:
    """Versions `signs` (version -> c; default version 1, c = 1)."""
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(SIGNED_CONFIG.format(name=name, extra=extra))
    for version, c in (signs or {1: 1.0}).items():
        builders._save(signed(c), repo / name / str(version) / "model.onnx")
