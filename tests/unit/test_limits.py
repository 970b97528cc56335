"""Per-model input limits (`max_input_shape`, `max_input_elements`, `max_bytes_element_size`):
read from the config at load, checked in `ModelSignature.bind`; and the decoders' own bounds on
declared shapes, which must hold before anything is allocated from them."""

from __future__ import annotations

import textwrap

import numpy as np
import orjson
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from inferd.config.input_limits import (
    DEFAULT_MAX_BYTES_ELEMENT_SIZE,
    DEFAULT_MAX_INPUT_ELEMENTS,
    read_limits,
)
from inferd.config.model_config import ConfigError
from inferd.errors import ErrorKind, InferdError
from inferd.protocol.grpc.protobuf_codec import decode_infer_request
from inferd.protocol.http.rest_codec import decode_request
from inferd.tensors.signature import ModelSignature
from inferd.tensors.wire_format import decode_bytes_elements
from inferd.types import InferRequest, Tensor

CONFIG = """
    name: "m"
    max_batch_size: 8
    input [
      {{ name: "TOKENS", data_type: TYPE_INT32, dims: [ -1 ] }},
      {{ name: "IMAGE", data_type: TYPE_FP32, dims: [ 3, -1, -1 ] }},
      {{ name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] }}
    ]
    output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ] }} ]
    {parameters}
"""


def config(**parameters: str) -> mc.ModelConfig:
    text = "\n".join(
        f"parameters {{ key: {orjson.dumps(k).decode()} value: "
        f"{{ string_value: {orjson.dumps(v).decode()} }} }}"
        for k, v in parameters.items()
    )
    cfg = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(CONFIG.format(parameters=text)), cfg)
    return cfg


def request(*tensors: Tensor) -> InferRequest:
    return InferRequest(model_name="m", model_version="", inputs=list(tensors))


def zeros(name: str, datatype: str, shape: tuple[int, ...]) -> Tensor:
    if datatype == "BYTES":
        data = np.full(shape, b"x", dtype=object)
    else:
        data = np.zeros(shape, dtype={"INT32": np.int32, "FP32": np.float32}[datatype])
    return Tensor(name, datatype, shape, data)


def all_inputs(tokens: int = 4, image: tuple[int, int] = (2, 2), text: int = 1) -> list[Tensor]:
    return [
        zeros("TOKENS", "INT32", (1, tokens)),
        zeros("IMAGE", "FP32", (1, 3, *image)),
        zeros("TEXT", "BYTES", (1, text)),
    ]


def bind_error(sig: ModelSignature, *tensors: Tensor) -> str:
    with pytest.raises(InferdError) as info:
        sig.bind(request(*tensors))
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    return info.value.message


# -- defaults and config validation -------------------------------------------------------


def test_defaults() -> None:
    limits = read_limits(config())
    assert limits.max_shape == {}
    assert limits.max_elements == DEFAULT_MAX_INPUT_ELEMENTS == 2**26
    assert limits.max_bytes_element_size == DEFAULT_MAX_BYTES_ELEMENT_SIZE == 16 * 2**20


def test_parameters_are_read() -> None:
    limits = read_limits(
        config(
            max_input_shape='{"TOKENS": [512], "IMAGE": [3, 1024, -1]}',
            max_input_elements="1000",
            max_bytes_element_size="64",
        )
    )
    assert limits.max_shape == {"TOKENS": (512,), "IMAGE": (3, 1024, -1)}
    assert limits.max_elements == 1000
    assert limits.max_bytes_element_size == 64


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"max_input_shape": '{"TOKENS": [512]'}, ["max_input_shape", "malformed JSON"]),
        ({"max_input_shape": "[512]"}, ["max_input_shape", "JSON object"]),
        ({"max_input_shape": '{"NOPE": [512]}'}, ["max_input_shape", "no input 'NOPE'", "TOKENS"]),
        ({"max_input_shape": '{"TOKENS": 512}'}, ["'TOKENS'", "list of positive integers"]),
        ({"max_input_shape": '{"TOKENS": [0]}'}, ["'TOKENS'", "list of positive integers"]),
        ({"max_input_shape": '{"TOKENS": [1.5]}'}, ["'TOKENS'", "list of positive integers"]),
        ({"max_input_shape": '{"TOKENS": [true]}'}, ["'TOKENS'", "list of positive integers"]),
        ({"max_input_shape": '{"TOKENS": [1, 512]}'}, ["'TOKENS'", "2 dimensions", "batch"]),
        ({"max_input_shape": '{"IMAGE": [2, 9, 9]}'}, ["'IMAGE'", "below its fixed dims"]),
        ({"max_input_elements": "lots"}, ["max_input_elements", "not an integer"]),
        ({"max_input_elements": "0"}, ["max_input_elements", ">= 1"]),
        ({"max_bytes_element_size": "-5"}, ["max_bytes_element_size", ">= 1"]),
    ],
)
def test_malformed_limits_are_config_errors(parameters: dict[str, str], words: list[str]) -> None:
    cfg = config(**parameters)
    with pytest.raises(ConfigError) as info:
        read_limits(cfg)
    message = str(info.value)
    assert message.startswith("m/config.pbtxt: parameters")
    for word in words:
        assert word in message
    with pytest.raises(ConfigError):  # the model fails at load, not at its first request
        ModelSignature(cfg)


# -- bind ---------------------------------------------------------------------------------


def test_within_limits_binds() -> None:
    sig = ModelSignature(config(max_input_shape='{"TOKENS": [512], "IMAGE": [3, 64, 64]}'))
    bound = sig.bind(request(*all_inputs(tokens=512, image=(64, 64))))
    assert bound.rows == 1


def test_one_past_max_input_shape_is_rejected() -> None:
    sig = ModelSignature(config(max_input_shape='{"TOKENS": [512]}'))
    tokens, image, text = all_inputs(tokens=513)
    message = bind_error(sig, tokens, image, text)
    assert "input 'TOKENS'" in message
    assert "max_input_shape" in message
    assert "[512]" in message and "513 > 512" in message


def test_max_input_shape_minus_one_is_unbounded() -> None:
    sig = ModelSignature(config(max_input_shape='{"IMAGE": [3, 8, -1]}'))
    sig.bind(request(*all_inputs(image=(8, 10_000))))
    message = bind_error(sig, *all_inputs(image=(9, 1)))
    assert "input 'IMAGE'" in message and "dimension 1: 9 > 8" in message


def test_max_input_shape_ignores_batch_dimension() -> None:
    sig = ModelSignature(config(max_input_shape='{"TOKENS": [4]}'))
    batch = [zeros(t.name, t.datatype, (8, *t.shape[1:])) for t in all_inputs(tokens=4)]
    assert sig.bind(request(*batch)).rows == 8


def test_max_input_elements_counts_the_whole_tensor() -> None:
    sig = ModelSignature(config(max_input_elements="100"))
    sig.bind(request(*all_inputs(tokens=100)))
    message = bind_error(sig, *all_inputs(tokens=101))
    assert "input 'TOKENS'" in message
    assert "101 elements" in message and "100" in message and "max_input_elements" in message
    batch = [zeros(t.name, t.datatype, (2, *t.shape[1:])) for t in all_inputs(tokens=51)]
    assert "102 elements" in bind_error(sig, *batch)


def test_default_max_input_elements_applies_without_config() -> None:
    sig = ModelSignature(config())
    tokens = Tensor(
        "TOKENS",
        "INT32",
        (1, 2**26 + 1),
        # A broadcast view: the shape is checked, nothing of that size is allocated.
        np.broadcast_to(np.zeros(1, dtype=np.int32), (1, 2**26 + 1)),
    )
    _, image, text = all_inputs()
    message = bind_error(sig, tokens, image, text)
    assert "input 'TOKENS'" in message and str(2**26) in message


def test_max_bytes_element_size() -> None:
    sig = ModelSignature(config(max_bytes_element_size="8"))
    tokens, image, _ = all_inputs()
    ok = Tensor("TEXT", "BYTES", (1, 2), np.array([[b"12345678", b""]], dtype=object))
    sig.bind(request(tokens, image, ok))
    long = Tensor("TEXT", "BYTES", (1, 3), np.array([[b"a", b"", b"123456789"]], dtype=object))
    message = bind_error(sig, tokens, image, long)
    assert "input 'TEXT'" in message
    assert "element 2" in message and "9 bytes" in message and "max_bytes_element_size" in message


def test_default_max_bytes_element_size() -> None:
    sig = ModelSignature(config())
    tokens, image, _ = all_inputs()
    big = np.empty((1, 1), dtype=object)
    big[0, 0] = b"x" * (16 * 2**20 + 1)
    message = bind_error(sig, tokens, image, Tensor("TEXT", "BYTES", (1, 1), big))
    assert "input 'TEXT'" in message and str(16 * 2**20) in message


# -- decoders: declared shapes are bounded by the data present, never allocated ---------------


def _http(inputs: list[dict[str, object]], binary: bytes = b"") -> str:
    head = orjson.dumps({"inputs": inputs})
    with pytest.raises(InferdError) as info:
        decode_request(head + binary, len(head) if binary else None, "m", "")
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    return info.value.message


def test_bytes_count_is_bounded_by_the_buffer_before_allocating() -> None:
    with pytest.raises(InferdError) as info:
        decode_bytes_elements(b"\0\0\0\0", 2**40, "input 'X'")
    assert "BYTES data of 4 bytes cannot hold 1099511627776 elements" in info.value.message
    params = {"binary_data_size": 4}
    message = _http(
        [{"name": "X", "datatype": "BYTES", "shape": [1, 2**40], "parameters": params}],
        b"\0\0\0\0",
    )
    assert "input 'X'" in message


@pytest.mark.parametrize(
    "shape",
    [[1, 2**40], [0, 2**63], [0, 2**64 - 1], [0, 2**62, 2**62], [1] * 40],
)
def test_huge_declared_shapes_are_400(shape: list[int]) -> None:
    for datatype in ("FP32", "BYTES"):
        assert "input 'X'" in _http(
            [{"name": "X", "datatype": datatype, "shape": shape, "data": []}]
        )
        params = {"binary_data_size": 4}
        assert "input 'X'" in _http(
            [{"name": "X", "datatype": datatype, "shape": shape, "parameters": params}],
            b"\0\0\0\0",
        )


@pytest.mark.parametrize("shape", [[1, 2**40], [0, 2**62, 2**62], [1] * 40, [2**31, 2**31]])
@pytest.mark.parametrize("raw", [True, False])
def test_grpc_huge_declared_shapes_are_400(shape: list[int], raw: bool) -> None:
    for datatype in ("FP32", "BYTES"):
        msg = pb.ModelInferRequest(model_name="m")
        msg.inputs.add(name="X", datatype=datatype, shape=shape)
        if raw:
            msg.raw_input_contents.append(b"\0\0\0\0")
        with pytest.raises(InferdError) as info:
            decode_infer_request(msg)
        assert info.value.kind is ErrorKind.INVALID_ARGUMENT
        assert "input 'X'" in info.value.message


def test_json_float_overflow_is_400_not_inf() -> None:
    message = _http([{"name": "X", "datatype": "FP16", "shape": [1], "data": [1e300]}])
    assert "out of FP16's range" in message
    message = _http([{"name": "X", "datatype": "FP32", "shape": [1], "data": [70000, 1e39]}])
    assert "out of FP32's range" in message


def test_json_floats_near_the_range_limit_are_accepted() -> None:
    # Their sum of squares passes the bound squared: the exact check must still accept them.
    near = [3.0e38, -3.0e38, 3.0e38, 3.4e38]
    tensor = {"name": "X", "datatype": "FP32", "shape": [2, 2], "data": near}
    request = decode_request(orjson.dumps({"inputs": [tensor]}), None, "m", "")
    np.testing.assert_array_equal(request.inputs[0].data, np.array(near, np.float32).reshape(2, 2))
    tensor = {"name": "X", "datatype": "FP16", "shape": [8], "data": [65000.0] * 8}
    request = decode_request(orjson.dumps({"inputs": [tensor]}), None, "m", "")
    assert request.inputs[0].data.dtype == np.float16


@pytest.mark.parametrize(
    ("datatype", "fits", "overflows"),
    [
        # JSON's shortest text for float32's largest value reads back just above it; it
        # still casts to that value. Past half a unit in the last place it would be inf.
        ("FP32", [3.4028235e38, -3.4028235e38, 3.4028235677973362e38], [3.4028235677973366e38]),
        ("FP16", [65504.0, 65519.99], [65520.0, -65520.0]),
    ],
)
def test_json_floats_at_the_type_limit(
    datatype: str, fits: list[float], overflows: list[float]
) -> None:
    dtype = np.float32 if datatype == "FP32" else np.float16
    largest = float(np.finfo(dtype).max)
    for value in fits:
        tensor = {"name": "X", "datatype": datatype, "shape": [1], "data": [value]}
        data = decode_request(orjson.dumps({"inputs": [tensor]}), None, "m", "").inputs[0].data
        assert abs(float(data[0])) == largest
    for value in overflows:
        assert "out of" in _http(
            [{"name": "X", "datatype": datatype, "shape": [1], "data": [value]}]
        )


def test_json_depth_limit_is_400() -> None:
    deep = b'{"inputs": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    with pytest.raises(InferdError) as info:
        decode_request(deep, None, "m", "")
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "malformed JSON" in info.value.message


# -- the server's bound on BYTES elements (--max-bytes-elements) -------------------------------


def test_bytes_elements_past_the_limit_are_400_on_every_path() -> None:
    empty = b"\0\0\0\0" * 9  # nine empty elements: enough data, one element too many
    with pytest.raises(InferdError) as info:
        decode_bytes_elements(empty, 9, "input 'X'", max_elements=8)
    assert "9 BYTES elements, more than the limit of 8" in info.value.message
    assert "--max-bytes-elements" in info.value.message
    assert len(decode_bytes_elements(empty[:32], 8, "input 'X'", max_elements=8)) == 8

    binary = {"name": "X", "datatype": "BYTES", "shape": [9], "parameters": {}}
    binary["parameters"] = {"binary_data_size": len(empty)}
    as_json = {"name": "X", "datatype": "BYTES", "shape": [9], "data": [""] * 9}
    for tensor, tail in ((binary, empty), (as_json, b"")):
        head = orjson.dumps({"inputs": [tensor]})
        with pytest.raises(InferdError) as info:
            decode_request(head + tail, len(head) if tail else None, "m", "", 8)
        assert "more than the limit of 8 per tensor" in info.value.message

    for raw in (True, False):
        msg = pb.ModelInferRequest(model_name="m")
        t = msg.inputs.add(name="X", datatype="BYTES", shape=[9])
        if raw:
            msg.raw_input_contents.append(empty)
        else:
            t.contents.bytes_contents.extend([b""] * 9)
        with pytest.raises(InferdError) as info:
            decode_infer_request(msg, max_bytes_elements=8)
        assert "more than the limit of 8 per tensor" in info.value.message


def test_json_bytes_count_is_checked_before_the_elements_are_walked() -> None:
    # One element declared, a million sent: refused for the count, not after a million
    # conversions; a non-string among them is never reached.
    data: list[object] = [""] * 1_000_000 + [5]
    message = _http([{"name": "X", "datatype": "BYTES", "shape": [1], "data": data}])
    assert "data holds 1000001 elements but shape [1] needs 1" in message


def test_an_output_requested_twice_is_refused_while_decoding() -> None:
    tensor = {"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}
    doc = {"inputs": [tensor], "outputs": [{"name": "Y"}] * 100_000}
    with pytest.raises(InferdError) as info:
        decode_request(orjson.dumps(doc), None, "m", "")
    assert info.value.message == "output 'Y' is requested more than once"
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    msg.outputs.add(name="Y")
    msg.outputs.add(name="Y")
    with pytest.raises(InferdError) as info:
        decode_infer_request(msg)
    assert info.value.message == "output 'Y' is requested more than once"
