"""Models for the lifecycle tests: versions that say which version they are."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import builders

PLUS_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 4 ] }} ]
dynamic_batching {{ }}
{extra}
"""


def plus(value: float) -> onnx.ModelProto:
    """y = x + value: a model whose output names the version that computed it."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "plus",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.full(4, value, np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write_plus_model(repo: Path, name: str, versions: list[int], extra: str = "") -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(PLUS_CONFIG.format(name=name, extra=extra))
    for v in versions:
        write_plus_version(repo / name, v)


def write_plus_version(model_dir: Path, version: int, staging: Path | None = None) -> None:
    """Write version `version`; through `staging` + rename, so a poll never sees half a file."""
    target = model_dir / str(version)
    if staging is None:
        builders._save(plus(float(version)), target / "model.onnx")
        return
    tmp = staging / f"{model_dir.name}-{version}"
    builders._save(plus(float(version)), tmp / "model.onnx")
    tmp.rename(target)


PY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
{extra}
"""

WARM_COUNTING_PY = '''
import numpy as np

class Model:
    """OUT = how many batches this instance ran before this one (warm-up included)."""
    def load(self, context):
        self.calls = 0
        self.sizes = []

    def predict(self, inputs):
        x = inputs["IN"]
        if (x == 0).all() and self.fail_on_zeros():
            raise RuntimeError("zeros are poison")
        out = np.full(x.shape, self.calls, dtype=np.float32)
        self.calls += 1
        return {"OUT": out}

    def fail_on_zeros(self):
        return False
'''

VERSION_PY = """
import numpy as np

class Model:
    def load(self, context):
        self.version = float(context.version)

    def predict(self, inputs):
        x = inputs["IN"]
        if self.version == {fail_version} and (x != 0).any():
            raise RuntimeError("version {fail_version} is broken")
        return {{"OUT": np.full(x.shape, self.version, dtype=np.float32)}}
"""


def write_python_model(
    repo: Path, name: str, code: str, extra: str = "", versions: tuple[int, ...] = (1,)
) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(
        PY_CONFIG.format(name=name, extra=textwrap.dedent(extra))
    )
    for v in versions:
        (repo / name / str(v)).mkdir(exist_ok=True)
        (repo / name / str(v) / "model.py").write_text(code)
