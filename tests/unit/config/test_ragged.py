"""Ragged batching without a server: the batch inputs Triton documents, the merge step, the
shape key that lets ragged requests share a batch, and the load errors of its config."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.backends.python.python_backend import PythonBackend
from inferd.config.model_config import ConfigError
from inferd.config.ragged_config import BatchInputSpec, RaggedPlan, read_ragged_plan
from inferd.repository.loader import prepare
from inferd.scheduling.merge import batch_input, merged_inputs
from inferd.tensors.signature import BoundRequest, ModelSignature
from inferd.types import InferRequest, Tensor
from tests.support.config_models import make_model, prepare_error
from tests.support.models import builders
from tests.support.ragged_models import RAGGED_TRITON_PY_CODE, ragged_sum

Kind = mc.BatchInput.Kind
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


def spec(kind: str, dtype: np.dtype = I32) -> BatchInputSpec:
    return BatchInputSpec(Kind.Value(kind), ("T",), dtype, "IN")


# -- the batch inputs, on the examples of Triton's docs -----------------------------------------

# ragged_batching.md: requests [1, 3], [1, 4], [1, 5] -> INDEX [3, 7, 12].
DOC_SHAPES = [(1, 3), (1, 4), (1, 5)]
# model_config.proto: a batch-2 request of items [3, 1] and a batch-1 request of item [2, 2].
ITEM_SHAPES = [(2, 3, 1), (1, 2, 2)]

KINDS = [
    ("BATCH_ELEMENT_COUNT", DOC_SHAPES, [3, 4, 5]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", DOC_SHAPES, [3, 7, 12]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", DOC_SHAPES, [0, 3, 7, 12]),
    ("BATCH_ITEM_SHAPE", ITEM_SHAPES, [[3, 1], [3, 1], [2, 2]]),
    ("BATCH_ITEM_SHAPE_FLATTEN", ITEM_SHAPES, [3, 1, 3, 1, 2, 2]),
    # Element counts include the batch dimension: 2 * 3 * 1 = 6 and 1 * 2 * 2 = 4.
    ("BATCH_ELEMENT_COUNT", ITEM_SHAPES, [6, 4]),
]


@pytest.mark.parametrize("dtype", [I32, F32], ids=["INT32", "FP32"])
@pytest.mark.parametrize(("kind", "shapes", "expected"), KINDS, ids=[k[0] for k in KINDS])
def test_batch_input_values(
    kind: str, shapes: list[tuple[int, ...]], expected: list[object], dtype: np.dtype
) -> None:
    value = batch_input(spec(kind, dtype), shapes)
    assert value.dtype == dtype
    np.testing.assert_array_equal(value, np.array(expected, dtype=dtype))


def test_max_element_count_is_the_shape() -> None:
    value = batch_input(spec("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"), DOC_SHAPES)
    assert value.shape == (5,)  # the longest request's 5 elements; the values carry nothing


# -- the merge step ---------------------------------------------------------------------------


def req(**inputs: np.ndarray) -> BoundRequest:
    rows = next(iter(inputs.values())).shape[0]
    return BoundRequest(dict(inputs), rows, (), ["OUT"])


PLAN = RaggedPlan(
    frozenset({"IN"}),
    (
        BatchInputSpec(Kind.Value("BATCH_ACCUMULATED_ELEMENT_COUNT"), ("ENDS", "ALSO"), I32, "IN"),
        BatchInputSpec(Kind.Value("BATCH_ITEM_SHAPE"), ("SHAPES",), F32, "IN"),
    ),
)


def test_ragged_inputs_are_concatenated_flat_beside_the_others() -> None:
    lengths = (3, 5, 7, 9)
    requests = [
        req(
            IN=np.arange(n, dtype=np.float32)[None] + 100 * k,
            W=np.full((1, 2), k, dtype=np.float32),  # not ragged: stacked by rows
        )
        for k, n in enumerate(lengths)
    ]
    inputs = merged_inputs(requests, PLAN)
    expected_in = np.concatenate([np.arange(n) + 100 * k for k, n in enumerate(lengths)])
    np.testing.assert_array_equal(inputs["IN"], expected_in)
    assert inputs["IN"].shape == (24,)
    np.testing.assert_array_equal(inputs["W"], np.repeat(np.arange(4.0), 2).reshape(4, 2))
    np.testing.assert_array_equal(inputs["ENDS"], [3, 8, 15, 24])
    np.testing.assert_array_equal(inputs["ALSO"], [3, 8, 15, 24])
    assert not np.shares_memory(inputs["ENDS"], inputs["ALSO"])  # each target its own
    np.testing.assert_array_equal(inputs["SHAPES"], [[3], [5], [7], [9]])


def test_a_lone_ragged_request_is_a_view_of_its_own_tensor() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = merged_inputs([req(IN=x)], PLAN)
    assert inputs["IN"].shape == (6,)
    assert np.shares_memory(inputs["IN"], x)  # flattened without a copy
    np.testing.assert_array_equal(inputs["ENDS"], [6])
    np.testing.assert_array_equal(inputs["SHAPES"], [[3], [3]])  # one item per row


def test_without_ragged_inputs_a_lone_request_is_passed_as_is() -> None:
    request = req(IN=np.ones((2, 3), np.float32))
    assert merged_inputs([request], RaggedPlan()) is request.inputs


# -- the shape key: ragged inputs may differ, the others may not -------------------------------

RAGGED_CONFIG = """
    name: "m"
    max_batch_size: 8
    input [
      { name: "IN", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true },
      { name: "W", data_type: TYPE_FP32, dims: [ -1 ] }
    ]
    batch_input [
      { kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "ENDS", data_type: TYPE_INT32,
        source_input: "IN" }
    ]
    output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


def parse(text: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(text), config)
    return config


def bind(sig: ModelSignature, in_length: int, w_length: int) -> BoundRequest:
    tensors = [
        Tensor("IN", "FP32", (1, in_length), np.zeros((1, in_length), np.float32)),
        Tensor("W", "FP32", (1, w_length), np.zeros((1, w_length), np.float32)),
    ]
    return sig.bind(InferRequest("m", "", tensors))


def test_ragged_inputs_are_left_out_of_the_shape_key() -> None:
    sig = ModelSignature(parse(RAGGED_CONFIG))
    assert bind(sig, 3, 2).shape_key == bind(sig, 9, 2).shape_key  # may share a batch
    assert bind(sig, 3, 2).shape_key != bind(sig, 3, 4).shape_key  # W is not ragged


def test_a_client_cannot_send_a_batch_input() -> None:
    sig = ModelSignature(parse(RAGGED_CONFIG))
    zeros = np.zeros((1, 3), np.float32)
    tensors = [Tensor(n, "FP32", (1, 3), zeros) for n in ("IN", "W")]
    tensors.append(Tensor("ENDS", "INT32", (1,), np.array([3], np.int32)))
    with pytest.raises(Exception, match="'ENDS' is a batch input") as info:
        sig.bind(InferRequest("m", "", tensors))
    assert "the server supplies it" in str(info.value)


# -- the config's checks, each naming the field ------------------------------------------------

BASE = """
    name: "m"
    max_batch_size: 8
    input [
      { name: "IN", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true },
      { name: "OPT", data_type: TYPE_FP32, dims: [ 1 ], optional: true }
    ]
    output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

ENDS = 'kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "ENDS", data_type: TYPE_INT32'

BAD_CONFIGS = [
    ("not batching", BASE.replace("max_batch_size: 8", "max_batch_size: 0"), "", "needs max_"),
    ("sequence model", BASE, "sequence_batching { }", "not supported with sequence_batching"),
    (
        "ragged and optional",
        BASE.replace("optional: true", "optional: true, allow_ragged_batch: true"),
        "",
        "input 'OPT': allow_ragged_batch: a ragged input cannot be optional",
    ),
    (
        "ragged with reshape",
        BASE.replace(
            "allow_ragged_batch: true", "allow_ragged_batch: true, reshape { shape: [ -1 ] }"
        ),
        "",
        "input 'IN': allow_ragged_batch: a ragged input reaches the model flattened",
    ),
    ("no target", BASE, 'batch_input [ { source_input: "IN" } ]', "target_name must name"),
    (
        "target is an input",
        BASE,
        'batch_input [ { target_name: "IN", source_input: "IN" } ]',
        "target_name 'IN' is also declared in input",
    ),
    (
        "INT64",
        BASE,
        'batch_input [ { target_name: "E", data_type: TYPE_INT64, source_input: "IN" } ]',
        "data_type TYPE_INT64 is not supported; a batch input is TYPE_INT32 or TYPE_FP32",
    ),
    (
        "two sources",
        BASE,
        f'batch_input [ {{ {ENDS}, source_input: [ "IN", "IN" ] }} ]',
        "source_input must name exactly one input, got 2",
    ),
    (
        "unknown source",
        BASE,
        f'batch_input [ {{ {ENDS}, source_input: "NOPE" }} ]',
        "source_input 'NOPE' is not an input of the model; its inputs: IN, OPT",
    ),
    (
        "optional source",
        BASE,
        f'batch_input [ {{ {ENDS}, source_input: "OPT" }} ]',
        "source_input 'OPT' is optional",
    ),
    (
        "target named twice",
        BASE,
        f'batch_input [ {{ {ENDS}, source_input: "IN" }}, {{ {ENDS}, source_input: "IN" }} ]',
        "batch_input.target_name: 'ENDS' is named by two batch inputs",
    ),
]


@pytest.mark.parametrize(
    ("text", "extra", "words"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_a_bad_ragged_config_fails_naming_the_field(text: str, extra: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_ragged_plan(parse(text + extra))
    message = str(info.value)
    assert message.startswith("m/config.pbtxt: "), message
    assert words in message, message


def test_a_good_ragged_config_reads_into_its_plan() -> None:
    plan = read_ragged_plan(parse(BASE + f'batch_input [ {{ {ENDS}, source_input: "IN" }} ]'))
    assert plan.ragged == {"IN"}
    (entry,) = plan.batch_inputs
    assert (entry.targets, entry.source, entry.dtype) == (("ENDS",), "IN", I32)
    assert read_ragged_plan(parse(BASE.replace(", allow_ragged_batch: true", ""))).active is False


# -- against the model files --------------------------------------------------------------------

ONNX_CONFIG = """
    name: "m"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
    batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "INDEX",
                    data_type: TYPE_INT32, source_input: "INPUT" } ]
    output [ { name: "SUM", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


def test_the_onnx_model_loads_with_its_batch_input(tmp_path: Path) -> None:
    config, _, _, _ = prepare(make_model(tmp_path, ONNX_CONFIG, model=ragged_sum()))
    assert [i.name for i in config.input] == ["INPUT"]  # INDEX is the server's


ONNX_MISMATCHES = [
    (
        "ragged input not flat",
        """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        """,
        builders.identity(TensorProto.FLOAT, ["batch", "n"]),
        "input 'INPUT0': allow_ragged_batch: the model file's shape is [-1, -1], but a ragged "
        "input reaches the model as the batch's values concatenated in one dimension",
    ),
    (
        "target not in the file",
        ONNX_CONFIG.replace('target_name: "INDEX"', 'target_name: "ENDS"'),
        ragged_sum(),
        "batch_input target_name 'ENDS': the model file has no such input",
    ),
    (
        "target of another type",
        ONNX_CONFIG.replace("data_type: TYPE_INT32", "data_type: TYPE_FP32"),
        ragged_sum(),
        "batch_input target_name 'INDEX': data_type TYPE_FP32 does not match the model "
        "file's TYPE_INT32",
    ),
    (
        "target of another rank",
        ONNX_CONFIG.replace("BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_ITEM_SHAPE"),
        ragged_sum(),
        "BATCH_ITEM_SHAPE is a tensor of 2 dimensions, but the model file's shape is [-1]",
    ),
]


@pytest.mark.parametrize(
    ("text", "model", "words"),
    [c[1:] for c in ONNX_MISMATCHES],
    ids=[c[0] for c in ONNX_MISMATCHES],
)
def test_the_onnx_file_must_take_what_the_config_says(
    tmp_path: Path, text: str, model: object, words: str
) -> None:
    message = prepare_error(make_model(tmp_path, text, model=model))  # type: ignore[arg-type]
    assert words in message, message


def test_pytorch_models_refuse_ragged_inputs(tmp_path: Path) -> None:
    text = ONNX_CONFIG.replace("onnxruntime_onnx", "pytorch_libtorch")
    model_dir = make_model(tmp_path, text, model=None)
    (model_dir / "1" / "model.pt").write_bytes(b"")
    message = prepare_error(model_dir)
    assert message.startswith(
        "m/config.pbtxt: input.allow_ragged_batch: only the onnxruntime and python backend reads it"
    ), message


def test_a_triton_python_model_refuses_batch_inputs(tmp_path: Path) -> None:
    # Its execute(requests) gets each request's own tensors: there is no batch to describe.
    version_dir = tmp_path / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text(RAGGED_TRITON_PY_CODE)
    config = parse(ONNX_CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "python"'))
    config.parameters["gate_path"].string_value = str(tmp_path / "gate")
    with pytest.raises(ConfigError, match="m/config.pbtxt: batch_input: a TritonPythonModel"):
        PythonBackend().load(LoadContext("m", "1", version_dir, config, 0, 1))
