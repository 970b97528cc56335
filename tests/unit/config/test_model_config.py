"""config.pbtxt parsing, ONNX auto-complete and validation, through `prepare` and `validate`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError, read_config, to_json, validate
from inferd.repository.loader import prepare, select_versions
from tests.support.config_models import (
    LINEAR_CONFIG,
    make_model,
    prepare_error,
)
from tests.support.models import builders


def parse(text: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(text), config)
    return config


# -- a valid config ---------------------------------------------------------------------------


def test_valid_config_prepares(tmp_path: Path) -> None:
    config, backend, versions, _ = prepare(make_model(tmp_path, LINEAR_CONFIG))
    assert config.name == "m"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["x"]
    assert [o.name for o in config.output] == ["y"]
    assert backend.model_file == "model.onnx"
    assert versions == [1]


def test_config_without_name_takes_the_directory_name(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace('name: "m"', "")
    config, _, _, _ = prepare(make_model(tmp_path, text))
    assert config.name == "m"


# -- parse and validation errors --------------------------------------------------------------


def test_malformed_pbtxt_names_the_file(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, 'name: "m"\nmax_batch_size: eight\ninput [ {')
    with pytest.raises(ConfigError) as info:
        read_config(model_dir)
    assert str(info.value).startswith("m/config.pbtxt")
    assert prepare_error(model_dir).startswith("m/config.pbtxt")


def test_unknown_field_is_a_parse_error(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, LINEAR_CONFIG + "\nmax_batch: 3\n")
    message = prepare_error(model_dir)
    assert message.startswith("m/config.pbtxt")
    assert "max_batch" in message


def test_name_mismatch(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, LINEAR_CONFIG.replace('name: "m"', 'name: "other"'))
    message = prepare_error(model_dir)
    assert "m/config.pbtxt" in message
    assert "'other'" in message
    assert "'m'" in message


def test_negative_max_batch_size(tmp_path: Path) -> None:
    text = """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: -1
        input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, 2 ] } ]
    """
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "max_batch_size" in message
    assert "-1" in message


def test_no_inputs(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=None)
    config = parse("""
        name: "m"
        platform: "onnxruntime_onnx"
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
    """)
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: input: the model declares no inputs"):
        validate(config, model_dir)


def test_no_outputs(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=None)
    config = parse("""
        name: "m"
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
    """)
    with pytest.raises(ConfigError, match="declares no outputs"):
        validate(config, model_dir)


def test_duplicate_input(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace(
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]',
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] },'
        ' { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]',
    )
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "input 'x'" in message
    assert "declared twice" in message


@pytest.mark.parametrize("dims", ["[ 0 ]", "[ -2 ]"])
def test_bad_dims(tmp_path: Path, dims: str) -> None:
    text = LINEAR_CONFIG.replace("dims: [ 4 ]", f"dims: {dims}")
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "input 'x'" in message
    assert "must be positive or -1" in message


def test_empty_dims(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=None)
    config = parse("""
        name: "m"
        input [ { name: "x", data_type: TYPE_FP32 } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
    """)
    with pytest.raises(ConfigError, match="input 'x': dims must list at least one dimension"):
        validate(config, model_dir)


def test_reshape_element_count_mismatch(tmp_path: Path) -> None:
    # The reshape is what the model sees and matches its file; the dims do not hold as much.
    text = LINEAR_CONFIG.replace("dims: [ 4 ] }", "dims: [ 3 ], reshape: { shape: [ 4 ] } }")
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "input 'x'" in message
    assert "reshape.shape [4] holds 4 elements but dims [3] hold 3" in message


def test_reshape_with_matching_element_count_is_accepted(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace("dims: [ 4 ] }", "dims: [ 2, 2 ], reshape: { shape: [ 4 ] } }")
    config, _, _, _ = prepare(make_model(tmp_path, text))
    assert list(config.input[0].dims) == [2, 2]
    assert list(config.input[0].reshape.shape) == [4]


def test_dynamic_batching_needs_max_batch_size(tmp_path: Path) -> None:
    text = """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 0
        input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, 2 ] } ]
        dynamic_batching { }
    """
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "dynamic_batching needs max_batch_size > 0" in message


@pytest.mark.parametrize("size", [16, 0])
def test_preferred_batch_size_outside_range(tmp_path: Path, size: int) -> None:
    text = LINEAR_CONFIG + f"dynamic_batching {{ preferred_batch_size: [ 4, {size} ] }}\n"
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert f"preferred_batch_size {size}" in message
    assert "max_batch_size (8)" in message


def test_bad_batching_policy(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + (
        'parameters { key: "batching_policy" value: { string_value: "greedy" } }\n'
    )
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "batching_policy 'greedy'" in message
    assert "work_conserving" in message


@pytest.mark.parametrize("policy", ["work_conserving", "window", "none"])
def test_known_batching_policies(tmp_path: Path, policy: str) -> None:
    text = LINEAR_CONFIG + (
        f'parameters {{ key: "batching_policy" value: {{ string_value: "{policy}" }} }}\n'
    )
    prepare(make_model(tmp_path, text))


def test_unknown_platform(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace("onnxruntime_onnx", "tensorflow_savedmodel")
    message = prepare_error(make_model(tmp_path, text))
    assert message.startswith("m/config.pbtxt")
    assert "tensorflow_savedmodel" in message
    assert "supported platforms: onnxruntime_onnx, pytorch_libtorch" in message
    assert "backend: one of onnxruntime, pytorch, python" in message


def test_unknown_backend(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "tensorrt"')
    message = prepare_error(make_model(tmp_path, text))
    assert message.startswith("m/config.pbtxt: backend:")
    assert "tensorrt" in message
    assert "supported backends: onnxruntime, pytorch, python" in message


@pytest.mark.parametrize(
    ("file", "names"),
    [("model.py", 'backend: "python"'), ("model.pt", 'platform: "pytorch_libtorch"')],
)
def test_model_without_config_that_needs_one_is_told_what_to_add(
    tmp_path: Path, file: str, names: str
) -> None:
    # Neither file says which tensors it takes: the fix is a config.pbtxt to write, not a
    # complaint about a field of a file that does not exist.
    model_dir = make_model(tmp_path, None, model=None)
    (model_dir / "1" / file).write_text("# the file's content is never read\n")
    message = prepare_error(model_dir)
    assert message.startswith(f"m: no config.pbtxt, and m/1/{file} does not say which tensors")
    assert f"add m/config.pbtxt declaring them, e.g. {names}" in message
    assert 'input [ { name: "INPUT0"' in message
    assert "output [" in message


def test_missing_version_directory(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, LINEAR_CONFIG, versions=())
    message = prepare_error(model_dir)
    assert message.startswith("m:")
    assert "no numeric version directory" in message


def test_no_config_and_no_model_file(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=None)
    message = prepare_error(model_dir)
    assert "platform/backend" in message
    assert "model.onnx" in message


# -- version policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [3]),
        ("version_policy: { latest: { num_versions: 1 } }", [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [2, 3]),
        ("version_policy: { latest: { num_versions: 9 } }", [1, 2, 3]),
        ("version_policy: { all: { } }", [1, 2, 3]),
        ("version_policy: { specific: { versions: [ 1, 3 ] } }", [1, 3]),
        ("version_policy: { specific: { versions: [ 2, 7 ] } }", [2]),
        ("version_policy: { specific: { versions: [ 7 ] } }", []),
    ],
)
def test_select_versions(policy: str, expected: list[int]) -> None:
    assert select_versions(parse(policy), [1, 2, 3]) == expected


def test_prepare_applies_the_version_policy(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + "version_policy: { all: { } }\n"
    _, _, versions, _ = prepare(make_model(tmp_path, text, versions=(1, 2, 10)))
    assert versions == [1, 2, 10]


def test_prepare_default_policy_is_latest(tmp_path: Path) -> None:
    _, _, versions, _ = prepare(make_model(tmp_path, LINEAR_CONFIG, versions=(1, 2, 10)))
    assert versions == [10]


def test_specific_policy_selecting_none(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + "version_policy: { specific: { versions: [ 5 ] } }\n"
    message = prepare_error(make_model(tmp_path, text, versions=(1, 2)))
    assert "m/config.pbtxt" in message
    assert "version_policy selects none" in message
    assert "[1, 2]" in message


def test_latest_zero_versions_is_rejected(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + "version_policy: { latest: { num_versions: 0 } }\n"
    message = prepare_error(make_model(tmp_path, text))
    assert "num_versions must be >= 1" in message


# -- ONNX auto-complete -----------------------------------------------------------------------


def test_onnx_autocomplete_without_config(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=builders.mlp([4, 8, 3], seed=0))
    config, _, versions, _ = prepare(model_dir)
    assert versions == [1]
    assert config.name == "m"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input", mc.TYPE_FP32, [4])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("probabilities", mc.TYPE_FP32, [3]),
        ("label", mc.TYPE_INT64, [1]),
    ]


def test_onnx_fixed_leading_dim_does_not_batch(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=builders.identity(TensorProto.INT32, [2, 3]))
    config, _, _, _ = prepare(model_dir)
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", mc.TYPE_INT32, [2, 3])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("OUTPUT0", mc.TYPE_INT32, [2, 3])
    ]


def test_onnx_config_with_only_inputs_gets_outputs(tmp_path: Path) -> None:
    text = """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
    """
    config, _, _, _ = prepare(make_model(tmp_path, text))
    assert config.max_batch_size == 8
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("y", mc.TYPE_FP32, [2])
    ]


def test_onnx_wrong_data_type(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace(
        'name: "x", data_type: TYPE_FP32', 'name: "x", data_type: TYPE_INT32'
    )
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "input 'x'" in message
    assert "TYPE_INT32" in message
    assert "TYPE_FP32" in message


def test_onnx_unknown_input_name(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace('name: "x"', 'name: "z"')
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "input 'z' is not in the model file" in message
    assert "x" in message


def test_onnx_wrong_rank(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace("dims: [ 4 ]", "dims: [ 4, 1 ]")
    message = prepare_error(make_model(tmp_path, text))
    assert "m/config.pbtxt" in message
    assert "input 'x'" in message
    assert "[4, 1]" in message


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        # A fixed size the model file contradicts.
        ("dims: [ 4 ]", "dims: [ 5 ]", ["input 'x': dims [5]", "dimension 0", "is 4 in the model"]),
        ("dims: [ 2 ]", "dims: [ 3 ]", ["output 'y': dims [3]", "is 2 in the model file but 3"]),
        # Any size, where the model file takes only one (a request of another would fail).
        ("dims: [ 4 ]", "dims: [ -1 ]", ["input 'x': dims [-1]", "is 4 in the model file but -1"]),
        # What the model sees is the reshape, so that is what must match.
        (
            "dims: [ 4 ] }",
            "dims: [ 4 ], reshape: { shape: [ 2, 2 ] } }",
            ["input 'x': reshape.shape [2, 2] have 2 dimensions", "[-1, 4] has 1"],
        ),
    ],
)
def test_onnx_dims_are_checked_against_the_model_file(
    tmp_path: Path, old: str, new: str, words: list[str]
) -> None:
    message = prepare_error(make_model(tmp_path, LINEAR_CONFIG.replace(old, new, 1)))
    assert message.startswith("m/config.pbtxt: ")
    assert "the model file's shape [-1, " in message
    for w in words:
        assert w in message


def test_onnx_declared_batching_needs_a_variable_batch_dimension(tmp_path: Path) -> None:
    text = """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 2
        input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 3 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 3 ] } ]
    """
    model = builders.identity(TensorProto.INT32, [2, 3])
    message = prepare_error(make_model(tmp_path, text, model=model))
    assert message.startswith("m/config.pbtxt: input 'INPUT0': max_batch_size 2 needs a variable")
    assert "shape is [2, 3]" in message
    assert "set max_batch_size: 0" in message


def test_onnx_variable_model_dims_take_any_config_size(tmp_path: Path) -> None:
    text = """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 7 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
    """
    model = builders.identity(TensorProto.FLOAT, ["batch", "n"])
    config, _, _, _ = prepare(make_model(tmp_path, text, model=model))
    assert list(config.input[0].dims) == [7]


def test_onnx_batching_config_for_fixed_batch_model(tmp_path: Path) -> None:
    """max_batch_size > 0 needs every tensor's leading dimension to be variable."""
    text = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    model = builders.identity(TensorProto.INT32, [2, 3])
    message = prepare_error(make_model(tmp_path, text, model=model))
    assert "m/config.pbtxt" in message
    assert "max_batch_size is 8" in message


def test_onnx_unreadable_model_file(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, LINEAR_CONFIG, model=None)
    (model_dir / "1" / "model.onnx").write_bytes(b"not an onnx file")
    message = prepare_error(model_dir)
    assert message.startswith("m/1/model.onnx: cannot read")


# -- to_json ----------------------------------------------------------------------------------


def test_to_json_renders_numbers(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + (
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 500 }\n"
    )
    config, _, _, _ = prepare(make_model(tmp_path, text))
    doc = to_json(config)
    assert doc["max_batch_size"] == 8
    assert doc["input"][0]["dims"] == [4]
    assert doc["output"][0]["dims"] == [2]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert doc["dynamic_batching"]["preferred_batch_size"] == [4]
    # Numbers on the wire, not strings.
    wire = json.dumps(doc)
    assert '"dims": [4]' in wire
    assert '"max_queue_delay_microseconds": 500' in wire


def test_to_json_includes_zero_max_batch_size(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None, model=builders.identity(TensorProto.INT32, [2, 3]))
    config, _, _, _ = prepare(model_dir)
    doc = to_json(config)
    assert doc["max_batch_size"] == 0
    assert doc["input"][0]["dims"] == [2, 3]
    assert doc["name"] == "m"
    assert doc["input"][0]["data_type"] == "TYPE_INT32"


def test_to_json_keeps_string_parameters_strings(tmp_path: Path) -> None:
    """A parameter's string_value is a string in Triton's JSON, even when it holds digits."""
    text = LINEAR_CONFIG + (
        'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
    )
    config, _, _, _ = prepare(make_model(tmp_path, text))
    doc = to_json(config)
    assert doc["parameters"]["intra_op_thread_count"] == {"string_value": "2"}
