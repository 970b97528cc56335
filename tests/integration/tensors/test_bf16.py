"""BF16 end to end: ONNX Runtime and TorchScript models, over HTTP JSON, HTTP binary and
gRPC, with Triton's own clients where they can send it (tritonclient's HTTP client sends
BF16 as binary only: the JSON cases use plain JSON bodies, as curl would)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import orjson
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.support.models import builders
from tests.support.servers import RunningServer, run_server

BF16 = ml_dtypes.bfloat16
# Exactly representable in bfloat16 (8 significant bits), and so are their doubles.
VALUES = [[1.5, -2.25, 0.0078125, 65280.0], [-0.5, 3.0, 1e-3, -1e30]]


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _onnx_model() -> Any:
    """OUT = IN and DOUBLED = IN * 2 (computed in float: ONNX Runtime's CPU kernels for
    bfloat16 arithmetic are few), FLOAT = IN as float32. No config.pbtxt: the config is
    completed from the file, which must say BF16."""
    bf16, f32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    two = helper.make_tensor("two", f32, [], [2.0])
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["IN"], ["OUT"]),
            helper.make_node("Cast", ["IN"], ["FLOAT"], to=f32),
            helper.make_node("Mul", ["FLOAT", "two"], ["wide"]),
            helper.make_node("Cast", ["wide"], ["DOUBLED"], to=bf16),
        ],
        "bf16",
        [helper.make_tensor_value_info("IN", bf16, ["batch", 4])],
        [
            helper.make_tensor_value_info("OUT", bf16, ["batch", 4]),
            helper.make_tensor_value_info("DOUBLED", bf16, ["batch", 4]),
            helper.make_tensor_value_info("FLOAT", f32, ["batch", 4]),
        ],
        [two],
    )
    return builders._ir(graph)


def _onnx_bf16_and_text() -> Any:
    """A BF16 input beside a string input: ONNX Runtime's Python API cannot feed both."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["IN"], ["OUT"]),
            helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"]),
        ],
        "bf16_text",
        [
            helper.make_tensor_value_info("IN", TensorProto.BFLOAT16, ["batch", 4]),
            helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("OUT", TensorProto.BFLOAT16, ["batch", 4]),
            helper.make_tensor_value_info("TEXT_OUT", TensorProto.STRING, ["batch", 1]),
        ],
    )
    return builders._ir(graph)


TORCH_CONFIG = """
name: "bf16_torch"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_BF16, dims: [ 4 ] } ]
output [ { name: "DOUBLED", data_type: TYPE_BF16, dims: [ 4 ] } ]
dynamic_batching { }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("bf16_repo")
    builders._save(_onnx_model(), repo / "bf16_onnx" / "1" / "model.onnx")
    builders._save(_onnx_bf16_and_text(), repo / "bf16_text" / "1" / "model.onnx")
    (repo / "bf16_torch" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(Doubler()), str(repo / "bf16_torch" / "1" / "model.pt"))
    (repo / "bf16_torch" / "config.pbtxt").write_text(textwrap.dedent(TORCH_CONFIG))
    with run_server(repo) as running:
        yield running


def _infer_http_json(server: RunningServer, model: str, data: np.ndarray) -> dict[str, Any]:
    body = {
        "inputs": [
            {
                "name": "IN" if model == "bf16_onnx" else "x",
                "datatype": "BF16",
                "shape": list(data.shape),
                "data": data.astype(np.float32).ravel().tolist(),
            }
        ]
    }
    with server.client() as c:
        r = c.post(f"/v2/models/{model}/infer", json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    return {
        o["name"]: np.array(o["data"], dtype=np.float32).astype(BF16).reshape(o["shape"])
        for o in doc["outputs"]
    } | {f"{o['name']}:datatype": o["datatype"] for o in doc["outputs"]}


def _infer_client(
    server: RunningServer, protocol: str, model: str, data: np.ndarray, names: list[str]
) -> dict[str, Any]:
    mod: Any = httpclient if protocol == "http-binary" else grpcclient
    address = f"127.0.0.1:{server.port}" if protocol == "http-binary" else server.grpc_address
    client = mod.InferenceServerClient(address)
    try:
        inp = mod.InferInput("IN" if model == "bf16_onnx" else "x", list(data.shape), "BF16")
        inp.set_data_from_numpy(data)
        result = client.infer(model, [inp], outputs=[mod.InferRequestedOutput(n) for n in names])
        response = result.get_response()
        outputs = response["outputs"] if protocol == "http-binary" else response.outputs
        types = {
            f"{o['name'] if isinstance(o, dict) else o.name}:datatype": (
                o["datatype"] if isinstance(o, dict) else o.datatype
            )
            for o in outputs
        }
        return {n: result.as_numpy(n) for n in names} | types
    finally:
        client.close()


PROTOCOLS = ["http-json", "http-binary", "grpc"]
MODELS = {"bf16_onnx": ["OUT", "DOUBLED", "FLOAT"], "bf16_torch": ["DOUBLED"]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", list(MODELS))
def test_bf16_round_trip(server: RunningServer, protocol: str, model: str) -> None:
    data = np.array(VALUES, dtype=BF16)
    if protocol == "http-json":
        got = _infer_http_json(server, model, data)
    else:
        got = _infer_client(server, protocol, model, data, MODELS[model])
    doubled = (data.astype(np.float32) * 2).astype(BF16)
    assert got["DOUBLED:datatype"] == "BF16"
    assert got["DOUBLED"].dtype == BF16
    # Bit for bit: BF16 travels as its 2-byte patterns, and JSON numbers convert exactly.
    assert got["DOUBLED"].view(np.uint16).tolist() == doubled.view(np.uint16).tolist()
    if model == "bf16_onnx":
        assert got["OUT"].view(np.uint16).tolist() == data.view(np.uint16).tolist()
        assert got["FLOAT:datatype"] == "FP32"
        np.testing.assert_array_equal(np.asarray(got["FLOAT"], np.float32), data.astype(np.float32))


def test_bf16_in_metadata_and_completed_config(server: RunningServer) -> None:
    with server.client() as c:
        meta = c.get("/v2/models/bf16_onnx").json()
        config = c.get("/v2/models/bf16_onnx/config").json()
        torch_meta = c.get("/v2/models/bf16_torch").json()
    assert {t["name"]: t["datatype"] for t in meta["inputs"] + meta["outputs"]} == {
        "IN": "BF16",
        "OUT": "BF16",
        "DOUBLED": "BF16",
        "FLOAT": "FP32",
    }
    assert {t["name"]: t["data_type"] for t in config["input"]} == {"IN": "TYPE_BF16"}
    assert torch_meta["inputs"][0]["datatype"] == "BF16"


def test_bf16_beside_a_string_input_fails_the_load_saying_why(server: RunningServer) -> None:
    with server.client() as c:
        index = c.post("/v2/repository/index", json={}).json()
        served = c.post("/v2/models/bf16_onnx/infer", json=_json_body([1, 2, 3, 4], [1, 4]))
    [row] = [r for r in index if r["name"] == "bf16_text"]
    assert row["state"] == "UNAVAILABLE"
    assert "bf16_text/config.pbtxt: input 'TEXT' is TYPE_STRING beside BF16" in row["reason"]
    assert served.status_code == 200  # the other models serve


def _json_body(data: list[Any], shape: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "IN", "datatype": "BF16", "shape": shape, "data": data}]}


@pytest.mark.parametrize(
    ("data", "shape", "words"),
    [
        ([4e38, 1, 2, 3], [1, 4], ["input 'IN'", "out of BF16's range"]),
        (["1", 2, 3, 4], [1, 4], ["input 'IN'", "BF16 data must be numbers"]),
        ([True, False, True, True], [1, 4], ["input 'IN'", "BF16 data must be numbers"]),
        ([1, 2, 3], [1, 4], ["input 'IN'", "3 elements", "needs 4"]),
    ],
    ids=["out of range", "strings", "booleans", "too few"],
)
def test_bf16_json_errors_name_the_input(
    server: RunningServer, data: list[Any], shape: list[int], words: list[str]
) -> None:
    with server.client() as c:
        r = c.post("/v2/models/bf16_onnx/infer", json=_json_body(data, shape))
        ok = c.post("/v2/models/bf16_onnx/infer", json=_json_body([1, 2, 3, 4], [1, 4]))
    assert r.status_code == 400
    for word in words:
        assert word in r.json()["error"]
    assert ok.status_code == 200


def test_bf16_binary_of_the_wrong_size_is_refused(server: RunningServer) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "IN",
                    "datatype": "BF16",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 6},
                }
            ]
        }
    )
    with server.client() as c:
        r = c.post(
            "/v2/models/bf16_onnx/infer",
            content=header + b"\0" * 6,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
    assert r.status_code == 400
    assert "6 bytes" in r.json()["error"] and "needs 8" in r.json()["error"]


def test_bf16_over_grpc_typed_contents_is_refused(server: RunningServer) -> None:
    channel = grpc.insecure_channel(server.grpc_address)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="bf16_onnx")
        tensor = request.inputs.add(name="IN", datatype="BF16", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1, 2, 3, 4])
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
    finally:
        channel.close()
    error: Any = info.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "BF16 data must be sent in raw_input_contents" in error.details()


def test_concurrent_bf16_requests_get_their_own_rows(server: RunningServer) -> None:
    """Concurrent requests are merged into batches (bfloat16 arrays concatenated and split
    by the batcher); each still gets its own rows back."""

    def one(i: int) -> np.ndarray:
        data = np.full((1, 4), float(i), dtype=BF16)
        got = _infer_client(server, "grpc", "bf16_torch", data, ["DOUBLED"])["DOUBLED"]
        return np.asarray(got)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for i, got in enumerate(results):
        assert got.astype(np.float32).tolist() == [[2.0 * i] * 4]
