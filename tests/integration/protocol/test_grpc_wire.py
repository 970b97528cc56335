"""gRPC at the message level: typed `contents`, raw buffers, limits, unimplemented methods."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.support.infer_samples import sample
from tests.support.models import ONNX_TYPES
from tests.support.servers import RunningServer, run_server

CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_address)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _request(model: str, datatype: str, shape: list[int]) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, id="wire")
    req.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    return req


def _shm(tensor: pb.ModelInferRequest.InferInputTensor, region: object, size: object) -> None:
    """Set the shared-memory parameters as any client could, typed as given."""
    for key, value in (("shared_memory_region", region), ("shared_memory_byte_size", size)):
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value


def _call_error(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value


@pytest.mark.parametrize("datatype", list(CONTENTS))
def test_typed_contents_every_datatype(stub, datatype: str) -> None:  # type: ignore[no-untyped-def]
    data = sample(datatype, (2, 3), seed=11)
    req = _request(f"identity_{datatype.lower()}", datatype, [2, 3])
    getattr(req.inputs[0].contents, CONTENTS[datatype]).extend(data.reshape(-1).tolist())
    resp = stub.ModelInfer(req)
    assert resp.id == "wire"
    assert list(resp.outputs[0].shape) == [2, 3]
    raw = resp.raw_output_contents[0]
    if datatype == "BYTES":
        assert raw.startswith(len(data.reshape(-1)[0]).to_bytes(4, "little"))
    else:
        got = np.frombuffer(raw, dtype=data.dtype).reshape(2, 3)
        np.testing.assert_array_equal(got, data)


WIRE_ERRORS = [
    (
        "raw count mismatch",
        "FP32",
        [1, 2],
        lambda r: r.raw_input_contents.extend([b"", b""]),
        ["raw_input_contents holds 2 buffers for 1 inputs"],
    ),
    (
        "raw size wrong",
        "FP32",
        [1, 2],
        lambda r: r.raw_input_contents.append(b"\0" * 7),
        ["input 'INPUT0'", "7 bytes", "needs 8"],
    ),
    (
        "contents count wrong",
        "FP32",
        [1, 2],
        lambda r: r.inputs[0].contents.fp32_contents.extend([1.0]),
        ["input 'INPUT0'", "fp32_contents holds 1", "needs 2"],
    ),
    (
        "contents out of range",
        "INT8",
        [1, 1],
        lambda r: r.inputs[0].contents.int_contents.extend([300]),
        ["input 'INPUT0'", "out of INT8's range"],
    ),
    ("FP16 as contents", "FP16", [1, 1], lambda r: None, ["input 'INPUT0'", "raw_input_contents"]),
    (
        "truncated BYTES",
        "BYTES",
        [1, 1],
        lambda r: r.raw_input_contents.append(b"\x09\0\0\0abc"),
        ["input 'INPUT0'", "past the data's end"],
    ),
    (
        "shared memory region not a string",
        "FP32",
        [1, 2],
        lambda r: _shm(r.inputs[0], 3, 8),
        ["input 'INPUT0'", "shared_memory_region must be a non-empty string"],
    ),
    (
        "shared memory size not an integer",
        "FP32",
        [1, 2],
        lambda r: _shm(r.inputs[0], "r", "8"),
        ["input 'INPUT0'", "shared_memory_byte_size must be an integer"],
    ),
    (
        "shared memory and contents",
        "FP32",
        [1, 2],
        lambda r: (_shm(r.inputs[0], "r", 8), r.inputs[0].contents.fp32_contents.extend([1, 2])),  # type: ignore[func-returns-value]
        ["input 'INPUT0'", "either contents or shared_memory_region"],
    ),
    (
        "raw contents for a shared memory input",
        "FP32",
        [1, 2],
        lambda r: (_shm(r.inputs[0], "r", 8), r.raw_input_contents.append(b"\0" * 8)),  # type: ignore[func-returns-value]
        ["raw_input_contents holds 1 buffers for 0 inputs not in shared memory"],
    ),
    (
        "unknown datatype",
        "FLOAT",
        [1, 1],
        lambda r: r.raw_input_contents.append(b"\0" * 4),
        ["input 'INPUT0'", "unknown datatype 'FLOAT'"],
    ),
]


@pytest.mark.parametrize(
    ("datatype", "shape", "fill", "words"),
    [c[1:] for c in WIRE_ERRORS],
    ids=[c[0] for c in WIRE_ERRORS],
)
def test_malformed_messages_are_invalid_argument(stub, datatype, shape, fill, words) -> None:  # type: ignore[no-untyped-def]
    model = "identity_" + ("fp32" if datatype == "FLOAT" else datatype.lower())
    req = _request(model, datatype, shape)
    fill(req)
    error = _call_error(stub.ModelInfer, req)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in error.details()


def test_response_over_the_send_limit_is_resource_exhausted(good_repository: Path) -> None:
    with run_server(good_repository, max_response_bytes=4096) as running:
        channel = grpc.insecure_channel(running.grpc_address)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        req = _request("identity_fp32", "FP32", [1, 2048])
        req.raw_input_contents.append(np.zeros(2048, np.float32).tobytes())
        error = _call_error(stub.ModelInfer, req)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = _request("identity_fp32", "FP32", [1, 4])
        small.raw_input_contents.append(np.zeros(4, np.float32).tobytes())
        assert stub.ModelInfer(small).outputs[0].name == "OUTPUT0"
        channel.close()


def test_grpc_can_be_turned_off(good_repository: Path) -> None:
    with run_server(good_repository, grpc_port=None) as running:
        assert running.server.grpc_server is None
        with running.client() as c:
            assert c.get("/v2/health/ready").status_code == 200


def test_all_types_have_a_contents_field_but_fp16() -> None:
    assert set(CONTENTS) == set(ONNX_TYPES) - {"FP16"}


def test_a_message_that_does_not_parse_is_invalid_argument(server: RunningServer) -> None:
    # inferd parses ModelInferRequest itself (off the loop when large): a malformed one is
    # the client's error, named as such, and the server keeps serving.
    with grpc.insecure_channel(server.grpc_address) as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a\xff\xff\xff\xff\x0f")  # field 1, a length past the message's end
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed ModelInferRequest" in str(info.value.details())
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest()).live
