"""`conform_output`: what a model produced, checked against the outputs its config declares
(the one check the request path and warm-up share)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.errors import ErrorKind
from inferd.tensors.conformance import OutputMismatchError, conform_output
from inferd.tensors.signature import ModelSignature
from inferd.types import Array

CONFIG = """
    name: "m"
    max_batch_size: 4
    input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]
    output [
      { name: "X", data_type: TYPE_FP32, dims: [ 4 ] },
      { name: "S", data_type: TYPE_STRING, dims: [ 1 ] },
      { name: "R", data_type: TYPE_INT64, dims: [ 2, 2 ], reshape: { shape: [ 4 ] } }
    ]
"""


@pytest.fixture(scope="module")
def signature() -> ModelSignature:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(CONFIG), config)
    return ModelSignature(config)


def check(signature: ModelSignature, name: str, outputs: dict[str, Array], rows: int = 2) -> Array:
    tensor = conform_output(signature, signature.outputs[name], outputs, rows)
    assert tensor.shape == tuple(tensor.data.shape)
    return tensor.data


def test_conforming_outputs_pass(signature: ModelSignature) -> None:
    x = np.ones((2, 4), np.float32)
    assert check(signature, "X", {"X": x}) is x  # no copy when nothing changes
    # A safe cast to the declared dtype, and the reshape back to the declared dims.
    assert check(signature, "X", {"X": np.ones((2, 4), np.float16)}).dtype == np.float32
    assert check(signature, "R", {"R": np.zeros((2, 4), np.int32)}).shape == (2, 2, 2)
    assert check(signature, "S", {"S": np.array([[b"a"], [b"b"]], dtype=object)}).shape == (2, 1)


# (output, what the model produced, words of the message)
MISMATCHES = [
    ("X", {"x": np.ones((2, 4), np.float32)}, ["produced no output 'X'", "(it produced 'x')"]),
    ("X", {"X": np.array([["a"] * 4] * 2)}, ["output 'X' is <U1", "does not convert to the FP32"]),
    ("R", {"R": np.zeros((2, 4), np.float32)}, ["output 'R' is float32", "the INT64 that"]),
    ("S", {"S": np.ones((2, 1), np.float32)}, ["output 'S' is float32", "TYPE_STRING"]),
    ("X", {"X": np.ones((3, 4), np.float32)}, ["shape [3, 4] for a batch of 2", "max_batch_size"]),
    ("X", {"X": np.ones((2, 5), np.float32)}, ["output 'X' has shape [2, 5]", "declares [-1, 4]"]),
    ("R", {"R": np.zeros((2, 3), np.int64)}, ["output 'R' has shape [2, 3]", "dims [2, 2]"]),
]


@pytest.mark.parametrize(("name", "outputs", "words"), MISMATCHES)
def test_mismatches_name_the_output_and_config(
    signature: ModelSignature, name: str, outputs: dict[str, Array], words: list[str]
) -> None:
    with pytest.raises(OutputMismatchError) as info:
        check(signature, name, outputs)
    assert info.value.kind is ErrorKind.MODEL_ERROR
    assert "m/config.pbtxt" in info.value.message
    for w in words:
        assert w in info.value.message
