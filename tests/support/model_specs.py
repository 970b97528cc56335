"""A model's typed spec (repository/spec.py) from a config text, for the spec tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.repository.spec import ModelSpec, parse_spec

PLATFORMS = {
    "onnxruntime": 'platform: "onnxruntime_onnx"',
    "pytorch": 'platform: "pytorch_libtorch"',
    "python": 'backend: "python"',
}


def config(
    parameters: dict[str, str] | None = None, backend: str = "onnxruntime", extra: str = ""
) -> mc.ModelConfig:
    text = f"""
        name: "m"
        {PLATFORMS[backend]}
        max_batch_size: 8
        input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 4 ] }} ]
        output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        {extra}
    """
    for key, value in (parameters or {}).items():
        text += f"parameters {{ key: {key!r} value: {{ string_value: {value!r} }} }}\n"
    return text_format.Parse(textwrap.dedent(text), mc.ModelConfig())


def spec_of(
    parameters: dict[str, str] | None = None, backend: str = "onnxruntime", extra: str = ""
) -> ModelSpec:
    return parse_spec(config(parameters, backend, extra), Path("m"))
