"""The v2 tensor codec: JSON and binary request bodies in, JSON and binary responses out."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferd.errors import ErrorKind, InferdError
from inferd.protocol.http.rest_codec import decode_request, encode_response
from inferd.types import InferResponse, RequestedOutput, Tensor

# The wire dtype of each datatype, written out here rather than taken from inferd.
WIRE = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

# Four values per datatype, including each type's extremes; all exact in JSON.
VALUES: dict[str, list[Any]] = {
    "BOOL": [True, False, False, True],
    "UINT8": [0, 1, 200, 255],
    "UINT16": [0, 7, 40000, 65535],
    "UINT32": [0, 9, 3_000_000_000, 2**32 - 1],
    "UINT64": [0, 11, 2**63, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-32768, -2, 3, 32767],
    "INT32": [-(2**31), -3, 4, 2**31 - 1],
    "INT64": [-(2**63), -4, 5, 2**63 - 1],
    "FP16": [-65504.0, -0.5, 0.25, 1.5],
    "FP32": [-1.5, 0.0, 3.25, 1e30],
    "FP64": [-2.5, 0.1, 1e300, 5e-324],
    "BYTES": ["", "a", "héllo", "x y z"],
}
NUMERIC = list(WIRE)
ALL_TYPES = [*NUMERIC, "BYTES"]


def wire_bytes(datatype: str, values: list[Any]) -> bytes:
    """Triton's binary tensor layout, built by hand."""
    if datatype == "BYTES":
        parts = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        return b"".join(struct.pack("<I", len(p)) + p for p in parts)
    return np.array(values, dtype=WIRE[datatype]).tobytes()


def binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def binary_body(inputs: list[dict[str, Any]], data: bytes) -> tuple[bytes, int]:
    header = orjson.dumps({"inputs": inputs})
    return header + data, len(header)


def json_body(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


def decode_error(body: bytes, header_length: int | None = None) -> str:
    with pytest.raises(InferdError) as info:
        decode_request(body, header_length, "m", "")
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    return info.value.message


def expected_array(datatype: str, values: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    if datatype == "BYTES":
        out = np.empty(len(values), dtype=object)
        out[:] = [v.encode("utf-8") for v in values]
        return out.reshape(shape)
    return np.array(values, dtype=WIRE[datatype].newbyteorder("=")).reshape(shape)


def assert_tensor(tensor: Tensor, datatype: str, values: list[Any], shape: tuple[int, ...]):
    expected = expected_array(datatype, values, shape)
    assert tensor.datatype == datatype
    assert tensor.shape == shape
    assert tensor.data.shape == shape
    assert tensor.data.dtype == expected.dtype
    assert tensor.data.tolist() == expected.tolist()


def response(*tensors: Tensor) -> InferResponse:
    return InferResponse("m", "1", list(tensors), id="req-1")


def split_body(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:header_length]), body[header_length:]


def tensor_of(datatype: str, values: list[Any], shape: tuple[int, ...], name: str = "OUT"):
    return Tensor(name, datatype, shape, expected_array(datatype, values, shape))


# -- decoding every datatype ------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_decode_json_every_datatype(datatype: str) -> None:
    values = VALUES[datatype]
    body = json_body([{"name": "IN", "datatype": datatype, "shape": [2, 2], "data": values}])
    request = decode_request(body, None, "m", "1")
    assert request.model_name == "m"
    assert request.model_version == "1"
    assert request.outputs is None
    [tensor] = request.inputs
    assert tensor.name == "IN"
    assert_tensor(tensor, datatype, values, (2, 2))


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_decode_json_nested_data(datatype: str) -> None:
    values = VALUES[datatype]
    nested = [values[:2], values[2:]]
    body = json_body([{"name": "IN", "datatype": datatype, "shape": [2, 2], "data": nested}])
    [tensor] = decode_request(body, None, "m", "").inputs
    assert_tensor(tensor, datatype, values, (2, 2))


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_decode_binary_every_datatype(datatype: str) -> None:
    values = VALUES[datatype]
    raw = wire_bytes(datatype, values)
    body, length = binary_body([binary_input("IN", datatype, [4], len(raw))], raw)
    [tensor] = decode_request(body, length, "m", "").inputs
    assert_tensor(tensor, datatype, values, (4,))


def test_decode_binary_and_json_inputs_mixed() -> None:
    a = wire_bytes("INT16", [1, 2, 3])
    b = wire_bytes("BYTES", ["p", "qq"])
    inputs = [
        binary_input("A", "INT16", [3], 6),
        {"name": "J", "datatype": "FP32", "shape": [1], "data": [2.5]},
        binary_input("B", "BYTES", [2], 11),
    ]
    body, length = binary_body(inputs, a + b)
    request = decode_request(body, length, "m", "")
    assert [t.name for t in request.inputs] == ["A", "J", "B"]
    assert request.inputs[0].data.tolist() == [1, 2, 3]
    assert request.inputs[1].data.tolist() == [2.5]
    assert request.inputs[2].data.tolist() == [b"p", b"qq"]


def test_decode_unaligned_binary_data() -> None:
    """A tensor that starts at an odd offset in the body still decodes (and is usable)."""
    a = wire_bytes("UINT8", [9])
    b = wire_bytes("FP64", [1.25, -2.0])
    inputs = [
        binary_input("A", "UINT8", [1], 1),
        binary_input("B", "FP64", [2], 16),
    ]
    body, length = binary_body(inputs, a + b)
    request = decode_request(body, length, "m", "")
    assert request.inputs[1].data.tolist() == [1.25, -2.0]
    assert request.inputs[1].data.flags.aligned


def test_decode_request_fields() -> None:
    body = json_body(
        [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}],
        id="abc",
        parameters={"priority": 1},
        outputs=[{"name": "OUT", "parameters": {"binary_data": True}}],
    )
    request = decode_request(body, None, "m", "")
    assert request.id == "abc"
    assert request.parameters == {"priority": 1}
    assert request.outputs == [RequestedOutput("OUT", {"binary_data": True})]


def test_decode_scalar_shape() -> None:
    body = json_body([{"name": "IN", "datatype": "FP32", "shape": [], "data": 1.5}])
    [tensor] = decode_request(body, None, "m", "").inputs
    assert tensor.shape == ()
    assert tensor.data.tolist() == 1.5


# -- encoding every datatype ------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_encode_json_every_datatype(datatype: str) -> None:
    values = VALUES[datatype]
    body, length = encode_response(response(tensor_of(datatype, values, (2, 2))), None, False)
    assert length is None
    doc = orjson.loads(body)
    assert doc["model_name"] == "m"
    assert doc["model_version"] == "1"
    assert doc["id"] == "req-1"
    [out] = doc["outputs"]
    assert out["name"] == "OUT"
    assert out["datatype"] == datatype
    assert out["shape"] == [2, 2]
    assert out["data"] == values
    assert "parameters" not in out


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_encode_binary_every_datatype(datatype: str) -> None:
    values = VALUES[datatype]
    body, length = encode_response(response(tensor_of(datatype, values, (2, 2))), None, True)
    assert length is not None
    doc, binary = split_body(body, length)
    [out] = doc["outputs"]
    assert out["datatype"] == datatype
    assert out["shape"] == [2, 2]
    assert "data" not in out
    assert out["parameters"] == {"binary_data_size": len(binary)}
    assert binary == wire_bytes(datatype, values)


def test_encode_binary_several_outputs_in_order() -> None:
    a = tensor_of("INT32", [1, 2], (2,), name="A")
    b = tensor_of("BYTES", ["xy"], (1,), name="B")
    c = tensor_of("FP64", [0.5], (1, 1), name="C")
    body, length = encode_response(response(a, b, c), None, True)
    doc, binary = split_body(body, length)
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [8, 6, 8]
    assert binary == wire_bytes("INT32", [1, 2]) + wire_bytes("BYTES", ["xy"]) + wire_bytes(
        "FP64", [0.5]
    )


def test_encode_non_contiguous_array() -> None:
    data = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    tensor = Tensor("OUT", "INT32", (3, 2), data)
    body, length = encode_response(response(tensor), None, True)
    _, binary = split_body(body, length)
    assert binary == wire_bytes("INT32", [0, 2, 4, 6, 8, 10])
    body, _ = encode_response(response(tensor), None, False)
    assert orjson.loads(body)["outputs"][0]["data"] == [0, 2, 4, 6, 8, 10]


def test_encode_empty_tensor_binary() -> None:
    """A tensor with a 0 in its shape encodes to zero bytes of binary data."""
    tensor = Tensor("OUT", "FP32", (0, 3), np.zeros((0, 3), dtype=np.float32))
    body, length = encode_response(response(tensor), None, True)
    doc, binary = split_body(body, length)
    assert doc["outputs"][0]["shape"] == [0, 3]
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert binary == b""


def test_encode_empty_tensor_json() -> None:
    tensor = Tensor("OUT", "FP32", (0, 3), np.zeros((0, 3), dtype=np.float32))
    body, length = encode_response(response(tensor), None, False)
    assert length is None
    assert orjson.loads(body)["outputs"][0]["data"] == []


def test_per_output_binary_data_overrides_the_default() -> None:
    a = tensor_of("INT32", [1, 2], (2,), name="A")
    b = tensor_of("INT32", [3, 4], (2,), name="B")
    c = tensor_of("INT32", [5, 6], (2,), name="C")
    requested = [
        RequestedOutput("A", {"binary_data": True}),
        RequestedOutput("B", {"binary_data": False}),
        RequestedOutput("C"),
    ]

    body, length = encode_response(response(a, b, c), requested, False)
    doc, binary = split_body(body, length)
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert by_name["A"]["parameters"] == {"binary_data_size": 8}
    assert by_name["B"]["data"] == [3, 4]
    assert by_name["C"]["data"] == [5, 6]
    assert binary == wire_bytes("INT32", [1, 2])

    body, length = encode_response(response(a, b, c), requested, True)
    doc, binary = split_body(body, length)
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert by_name["A"]["parameters"] == {"binary_data_size": 8}
    assert by_name["B"]["data"] == [3, 4]
    assert by_name["C"]["parameters"] == {"binary_data_size": 8}
    assert binary == wire_bytes("INT32", [1, 2]) + wire_bytes("INT32", [5, 6])


def test_all_json_when_every_output_asks_for_json() -> None:
    a = tensor_of("INT32", [1], (1,), name="A")
    body, length = encode_response(
        response(a), [RequestedOutput("A", {"binary_data": False})], True
    )
    assert length is None
    assert orjson.loads(body)["outputs"][0]["data"] == [1]


def test_non_utf8_bytes_output_falls_back_to_binary() -> None:
    data = np.array([b"ok", b"\xff\xfe"], dtype=object)
    text = tensor_of("BYTES", ["fine"], (1,), name="TEXT")
    raw = Tensor("RAW", "BYTES", (2,), data)
    body, length = encode_response(response(text, raw), None, False)
    assert length is not None
    doc, binary = split_body(body, length)
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert by_name["TEXT"]["data"] == ["fine"]
    assert "data" not in by_name["RAW"]
    assert by_name["RAW"]["parameters"] == {"binary_data_size": len(binary)}
    assert binary == struct.pack("<I", 2) + b"ok" + struct.pack("<I", 2) + b"\xff\xfe"


def test_response_parameters_and_missing_id() -> None:
    resp = InferResponse("m", "2", [tensor_of("INT8", [1], (1,))], parameters={"k": "v"})
    doc = orjson.loads(encode_response(resp, None, False)[0])
    assert "id" not in doc
    assert doc["parameters"] == {"k": "v"}


# -- round trips ------------------------------------------------------------------------------


def as_request(body: bytes, header_length: int | None) -> tuple[bytes, int | None]:
    """Turn an encoded response into a request body carrying the outputs as inputs."""
    doc, binary = split_body(body, header_length)
    header = orjson.dumps({"inputs": doc["outputs"]})
    if header_length is None:
        return header, None
    return header + binary, len(header)


def round_trip(tensors: list[Tensor], binary: bool) -> list[Tensor]:
    body, length = encode_response(response(*tensors), None, binary)
    return decode_request(*as_request(body, length), "m", "").inputs


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_round_trip_every_datatype(binary: bool) -> None:
    tensors = [tensor_of(dt, VALUES[dt], (2, 2), name=f"T_{dt}") for dt in ALL_TYPES]
    decoded = round_trip(tensors, binary)
    assert [t.name for t in decoded] == [t.name for t in tensors]
    for before, after in zip(tensors, decoded, strict=True):
        assert after.datatype == before.datatype
        assert after.shape == before.shape
        assert after.data.dtype == before.data.dtype
        assert after.data.tolist() == before.data.tolist()


def _numeric_arrays() -> st.SearchStrategy[tuple[str, np.ndarray]]:
    def for_type(datatype: str) -> st.SearchStrategy[tuple[str, np.ndarray]]:
        dtype = WIRE[datatype].newbyteorder("=")
        elements = None
        if dtype.kind == "f":
            elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False)
        arrays = hnp.arrays(
            dtype,
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4),
            elements=elements,
        )
        return arrays.map(lambda a: (datatype, a))

    return st.sampled_from(NUMERIC).flatmap(for_type)


@settings(max_examples=150, deadline=None, database=None)
@given(case=_numeric_arrays(), binary=st.booleans())
def test_round_trip_property(case: tuple[str, np.ndarray], binary: bool) -> None:
    datatype, array = case
    tensor = Tensor("T", datatype, array.shape, array)
    [after] = round_trip([tensor], binary)
    assert after.datatype == datatype
    assert after.shape == array.shape
    assert after.data.dtype == array.dtype
    np.testing.assert_array_equal(after.data, array)


# -- request errors ---------------------------------------------------------------------------


def test_malformed_json() -> None:
    assert "malformed JSON" in decode_error(b'{"inputs": [')


def test_json_body_not_an_object() -> None:
    assert "must be an object" in decode_error(b"[1, 2]")


@pytest.mark.parametrize("doc", [{}, {"inputs": {}}, {"inputs": "IN"}, {"inputs": []}])
def test_inputs_missing_or_not_a_list(doc: dict[str, Any]) -> None:
    assert "'inputs' must be a non-empty list" in decode_error(orjson.dumps(doc))


@pytest.mark.parametrize("shape", [[2, "2"], [2.0], "2", [True], None, [[2]]])
def test_shape_not_a_list_of_ints(shape: Any) -> None:
    body = json_body([{"name": "IN", "datatype": "INT32", "shape": shape, "data": [1, 2]}])
    message = decode_error(body)
    assert "input 'IN'" in message
    assert "'shape'" in message


def test_negative_dim() -> None:
    body = json_body([{"name": "IN", "datatype": "INT32", "shape": [-1, 2], "data": [1, 2]}])
    message = decode_error(body)
    assert "input 'IN'" in message
    assert "non-negative" in message


def test_json_element_count_mismatch() -> None:
    body = json_body([{"name": "IN", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}])
    message = decode_error(body)
    assert "input 'IN'" in message
    assert "3 elements" in message
    assert "needs 4" in message


def test_json_bytes_element_count_mismatch() -> None:
    body = json_body([{"name": "S", "datatype": "BYTES", "shape": [3], "data": ["a", "b"]}])
    message = decode_error(body)
    assert "input 'S'" in message


def test_binary_element_count_mismatch() -> None:
    raw = wire_bytes("INT32", [1, 2, 3])
    inputs = [binary_input("IN", "INT32", [2], 12)]
    message = decode_error(*binary_body(inputs, raw))
    assert "input 'IN'" in message
    assert "12 bytes" in message
    assert "needs 8" in message


def test_binary_data_size_past_end_of_body() -> None:
    raw = wire_bytes("INT32", [1, 2])
    inputs = [binary_input("IN", "INT32", [4], 16)]
    message = decode_error(*binary_body(inputs, raw))
    assert "input 'IN'" in message
    assert "binary_data_size 16" in message


def test_second_input_past_end_of_body() -> None:
    raw = wire_bytes("INT32", [1, 2])
    inputs = [
        binary_input("A", "INT32", [1], 4),
        binary_input("B", "INT32", [2], 8),
    ]
    assert "input 'B'" in decode_error(*binary_body(inputs, raw))


def test_extra_trailing_binary_bytes() -> None:
    raw = wire_bytes("INT32", [1, 2]) + b"\x00\x01\x02"
    inputs = [binary_input("IN", "INT32", [2], 8)]
    assert "3 bytes more" in decode_error(*binary_body(inputs, raw))


def test_binary_data_without_binary_inputs() -> None:
    body, length = binary_body(
        [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}], b"\x00" * 4
    )
    assert "4 bytes more" in decode_error(body, length)


def test_truncated_bytes_element() -> None:
    raw = struct.pack("<I", 1) + b"a" + struct.pack("<I", 10) + b"abc"
    inputs = [binary_input("S", "BYTES", [2], len(raw))]
    message = decode_error(*binary_body(inputs, raw))
    assert "input 'S'" in message
    assert "element 1" in message


def test_bytes_length_prefix_cut_short() -> None:
    raw = struct.pack("<I", 5) + b"abcde" + b"\x02\x00"  # room for 2 prefixes, not 2 elements
    inputs = [binary_input("S", "BYTES", [2], len(raw))]
    message = decode_error(*binary_body(inputs, raw))
    assert "input 'S'" in message
    assert "after 1 of 2 elements" in message


def test_bytes_data_past_its_elements() -> None:
    raw = wire_bytes("BYTES", ["a"]) + b"zz"
    inputs = [binary_input("S", "BYTES", [1], len(raw))]
    message = decode_error(*binary_body(inputs, raw))
    assert "input 'S'" in message
    assert "2 bytes past" in message


@pytest.mark.parametrize("datatype", ["FLOAT32", "fp32", "STRING", 5])
def test_wrong_datatype_name(datatype: Any) -> None:
    body = json_body([{"name": "IN", "datatype": datatype, "shape": [1], "data": [1]}])
    message = decode_error(body)
    assert "input 'IN'" in message
    assert "datatype" in message


def test_data_and_binary_data_size_both_given() -> None:
    raw = wire_bytes("INT32", [1])
    inputs = [
        {
            "name": "IN",
            "datatype": "INT32",
            "shape": [1],
            "data": [1],
            "parameters": {"binary_data_size": 4},
        }
    ]
    message = decode_error(*binary_body(inputs, raw))
    assert "input 'IN'" in message
    assert "not both" in message


def test_neither_data_nor_binary_data_size() -> None:
    message = decode_error(json_body([{"name": "IN", "datatype": "INT32", "shape": [1]}]))
    assert "input 'IN'" in message


@pytest.mark.parametrize("extra", [1, 1000])
def test_header_length_larger_than_body(extra: int) -> None:
    body = json_body([{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}])
    message = decode_error(body, len(body) + extra)
    assert "Inference-Header-Content-Length" in message


def test_negative_header_length() -> None:
    body = json_body([{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}])
    assert "Inference-Header-Content-Length" in decode_error(body, -1)


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("BOOL", [1, 0]),
        ("BYTES", [1, 2]),
        ("INT32", ["a", "b"]),
        ("UINT8", [256, 1]),
        ("UINT8", [-1, 1]),
        ("INT8", [128, 1]),
    ],
)
def test_json_data_that_does_not_fit_the_datatype(datatype: str, data: list[Any]) -> None:
    body = json_body([{"name": "IN", "datatype": datatype, "shape": [2], "data": data}])
    assert "input 'IN'" in decode_error(body)


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("INT32", [1.5, 2]), ("FP32", ["1.5", "2"]), ("UINT16", [True, False])],
)
def test_json_data_of_the_wrong_json_type(datatype: str, data: list[Any]) -> None:
    """JSON numbers are not silently truncated, and strings/booleans are not numbers."""
    body = json_body([{"name": "IN", "datatype": datatype, "shape": [2], "data": data}])
    assert "input 'IN'" in decode_error(body)


def test_input_without_name() -> None:
    body = json_body([{"datatype": "INT32", "shape": [1], "data": [1]}])
    assert "inputs[0]" in decode_error(body)
