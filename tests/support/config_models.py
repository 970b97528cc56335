"""Model configs and ONNX models the config and spec tests build (a linear model, its config, a
config that should fail to load)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import onnx
import pytest

from inferd.config.model_config import ConfigError
from inferd.repository.loader import prepare
from tests.support.models import builders

# x: FP32 [batch, 4] -> y: FP32 [batch, 2]
LINEAR = builders.linear(4, 2, seed=1)


LINEAR_CONFIG = """
    name: "m"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
    output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
"""


def make_model(
    repo: Path,
    config: str | None,
    model: onnx.ModelProto | None = LINEAR,
    versions: tuple[int, ...] = (1,),
    name: str = "m",
) -> Path:
    """`<repo>/<name>/config.pbtxt` (unless None) and `<repo>/<name>/<v>/model.onnx`."""
    model_dir = repo / name
    model_dir.mkdir(parents=True)
    for v in versions:
        (model_dir / str(v)).mkdir()
        if model is not None:
            builders._save(model, model_dir / str(v) / "model.onnx")
    if config is not None:
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    return model_dir


def prepare_error(model_dir: Path) -> str:
    with pytest.raises(ConfigError) as info:
        prepare(model_dir)
    return str(info.value)
