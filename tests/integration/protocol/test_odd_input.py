"""Correct on odd but valid input, strict on odd invalid input (issue #14, item 5), over real
sockets and both protocols where the case applies."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.support.batch_statistics import batch_statistics
from tests.support.models import build_good_repository
from tests.support.servers import RunningServer, batcher_of, run_server, wait_for

# OUT = A + B + 100 C, each optional input counting 0 when absent (two optional inputs of one
# shape: requests sending one each have the same shapes); A = 1000 waits while the gate exists.
OPTIONAL_PY = """
import os, time
import numpy as np

class Model:
    def load(self, context):
        self.gate = context.parameters["gate_path"]

    def predict(self, inputs):
        a = inputs["A"]
        if (a == 1000).any():
            give_up = time.monotonic() + 60
            while os.path.exists(self.gate) and time.monotonic() < give_up:
                time.sleep(0.002)
        b, c = inputs.get("B", np.float32(0)), inputs.get("C", np.float32(0))
        return {"OUT": a + b + 100 * c}
"""

OPTIONAL_CONFIG = """
name: "optional"
backend: "python"
max_batch_size: 32
input [
  { name: "A", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "B", data_type: TYPE_FP32, dims: [ 1 ], optional: true },
  { name: "C", data_type: TYPE_FP32, dims: [ 1 ], optional: true }
]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
dynamic_batching { }
parameters { key: "gate_path" value: { string_value: "%s" } }
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "closed"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("odd-input")
    build_good_repository(repo)  # identity_<datatype>: one ONNX identity model per datatype
    (repo / "optional" / "1").mkdir(parents=True)
    (repo / "optional" / "config.pbtxt").write_text(OPTIONAL_CONFIG % gate)
    (repo / "optional" / "1" / "model.py").write_text(OPTIONAL_PY)
    with run_server(repo) as running:
        yield running


# -- optional inputs ------------------------------------------------------------------------


Case = dict[str, float]  # input name -> its one value


def _optional_http(server: RunningServer, case: Case) -> float:
    inputs = [
        {"name": name, "datatype": "FP32", "shape": [1, 1], "data": [v]} for name, v in case.items()
    ]
    r = httpx.post(f"{server.url}/v2/models/optional/infer", json={"inputs": inputs}, timeout=60)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


def _optional_grpc(server: RunningServer, case: Case) -> float:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        tensors = []
        for name, v in case.items():
            t = grpcclient.InferInput(name, [1, 1], "FP32")
            t.set_data_from_numpy(np.array([[v]], np.float32))
            tensors.append(t)
        out = client.infer("optional", tensors, client_timeout=60).as_numpy("OUT")
        assert out is not None
        return float(out[0, 0])
    finally:
        client.close()


def _expected(case: Case) -> float:
    return case["A"] + case.get("B", 0.0) + 100 * case.get("C", 0.0)


def _case(i: int, optional: str) -> Case:
    """A = i and, when `optional` names one, that input = i + 1."""
    return {"A": float(i)} | ({optional: float(i + 1)} if optional else {})


def test_requests_with_different_optional_inputs_are_answered_right(
    server: RunningServer,
) -> None:
    """The finding: mixed in one batch, 49 of 50 valid requests failed with KeyError."""
    results: dict[int, float] = {}
    cases = {i: _case(i, ("B", "C", "")[i % 3]) for i in range(50)}

    def send(i: int) -> None:
        infer = _optional_http if i % 2 else _optional_grpc
        results[i] = infer(server, cases[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: _expected(case) for i, case in cases.items()}


def test_requests_with_the_same_optional_inputs_still_batch(
    server: RunningServer, gate: Path
) -> None:
    batcher = batcher_of(server, "optional")
    gate.touch()
    results: dict[int, float] = {}

    def send(i: int, case: Case) -> None:
        infer = _optional_http if i % 2 else _optional_grpc
        results[i] = infer(server, case)

    holder = threading.Thread(target=send, args=(-1, {"A": 1000.0}))
    holder.start()
    wait_for(batcher, lambda b: b.inflight() == 1 and b.queue_depth() == 0, "the holder executing")
    threads: list[threading.Thread] = []
    cases: dict[int, Case] = {}
    for group, optional in enumerate(("B", "C", "B")):  # queued in three runs of ten
        for k in range(10):
            i = group * 10 + k
            cases[i] = _case(i, optional)
            threads.append(threading.Thread(target=send, args=(i, cases[i])))
            threads[-1].start()
        queued = (group + 1) * 10
        wait_for(batcher, lambda b: b.queue_depth() == queued, "the run queued")  # noqa: B023
    before = batch_statistics(server, "optional")
    gate.unlink()
    for t in [holder, *threads]:
        t.join(timeout=60)
    assert results == {-1: 1000.0} | {i: _expected(case) for i, case in cases.items()}
    # The holder, then one batch per run: requests sending the same inputs still batch.
    assert (batch_statistics(server, "optional") - before).sizes == {1: 1, 10: 3}


# -- JSON values, checked exactly against the datatype (HTTP: JSON is HTTP's) ---------------

JSON_VALUES = [
    # (datatype, data, None: accepted and echoed back as `data` | the 400's words)
    ("FP16", [65504, -65504, 0.5], None),
    ("FP16", [4294967296], "out of FP16's range"),  # passed an int64 sum of squares
    ("FP16", [-9223372036854775808], "out of FP16's range"),
    ("FP16", [65520], "out of FP16's range"),
    ("FP32", [1e39], "out of FP32's range"),
    ("FP32", [True, 2], "booleans among them"),
    ("FP32", [2.5, False], "booleans among them"),
    ("INT32", [1, True], "booleans among them"),
    ("INT8", [127, -128], None),
    ("INT8", [300], "out of INT8's range"),
    ("UINT8", [-1], "out of UINT8's range"),
    ("INT64", [9223372036854775808], "out of INT64's range"),
    ("UINT64", [18446744073709551615], None),
    ("UINT64", [18446744073709551616], "does not fit datatype UINT64"),
    ("INT32", [1.5], "must be integers"),
    ("BOOL", [True, False], None),
    ("BOOL", [1, 0], "BOOL data must be true/false"),
    ("FP64", ["1.0"], "FP64 data must be numbers"),
]


@pytest.mark.parametrize(("datatype", "data", "error"), JSON_VALUES)
def test_json_values_are_checked_exactly(
    server: RunningServer, datatype: str, data: list[Any], error: str | None
) -> None:
    model = f"identity_{datatype.lower()}"
    body = {
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, len(data)], "data": data}]
    }
    with server.client() as c:
        r = c.post(f"/v2/models/{model}/infer", content=json.dumps(body))  # ints past 2**64
        if error is None:
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == data
        else:
            assert r.status_code == 400, r.text
            assert "input 'INPUT0'" in r.json()["error"]
            assert error in r.json()["error"]
        assert c.get("/v2/health/ready").status_code == 200


# -- headers and flags, parsed strictly -------------------------------------------------------

FP32_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}

HEADERS = [
    ("inferd-timeout-ms", value, "inferd-timeout-ms")
    for value in ("inf", "nan", "-1", "1e400", "0", "1e3", "5 5", "5ms", "99999999999")
] + [
    ("Inference-Header-Content-Length", value, "Inference-Header-Content-Length")
    for value in ("garbage", "-1", "+5", "1_0", "1 2", "99999999999999999999")
]


@pytest.mark.parametrize(("header", "value", "named"), HEADERS)
def test_header_values_are_parsed_strictly(
    server: RunningServer, header: str, value: str, named: str
) -> None:
    with server.client() as c:
        r = c.post(
            "/v2/models/identity_fp32/infer",
            content=orjson.dumps(FP32_BODY),
            headers={header: value},
        )
        assert r.status_code == 400, r.text
        assert named in r.json()["error"]
        ok = c.post(
            "/v2/models/identity_fp32/infer",
            content=orjson.dumps(FP32_BODY),
            headers={"inferd-timeout-ms": "30000.5"},
        )
        assert ok.status_code == 200, ok.text


# (where the flag goes, its value): a flag must be a boolean, on both protocols.
FLAGS = [
    ("request", "binary_data_output", "no"),
    ("request", "binary_data_output", 1),
    ("output", "binary_data", "no"),
    ("output", "binary_data", "false"),
]


def _flagged_http(server: RunningServer, where: str, key: str, value: Any) -> tuple[int, str]:
    body: dict[str, Any] = dict(FP32_BODY)
    if where == "request":
        body["parameters"] = {key: value}
    else:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": {key: value}}]
    r = httpx.post(f"{server.url}/v2/models/identity_fp32/infer", content=orjson.dumps(body))
    return r.status_code, r.json().get("error", "")


def _grpc_stub(server: RunningServer) -> Any:
    import grpc

    channel = grpc.insecure_channel(server.grpc_address)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _grpc_call(server: RunningServer, msg: pb.ModelInferRequest) -> tuple[int, str]:
    import grpc

    channel, stub = _grpc_stub(server)
    try:
        stub.ModelInfer(msg, timeout=30)
        return 200, ""
    except grpc.RpcError as exc:
        code = {grpc.StatusCode.INVALID_ARGUMENT: 400}.get(exc.code(), 0)
        return code, str(exc.details())
    finally:
        channel.close()


def _fp32_message() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="identity_fp32")
    t = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    t.contents.fp32_contents.append(1.5)
    return msg


def _flagged_grpc(server: RunningServer, where: str, key: str, value: Any) -> tuple[int, str]:
    msg = _fp32_message()
    params = msg.parameters if where == "request" else msg.outputs.add(name="OUTPUT0").parameters
    if isinstance(value, str):
        params[key].string_param = value
    else:
        params[key].int64_param = value
    return _grpc_call(server, msg)


@pytest.mark.parametrize("send", [_flagged_http, _flagged_grpc], ids=["http", "grpc"])
@pytest.mark.parametrize(("where", "key", "value"), FLAGS)
def test_binary_flags_must_be_booleans(
    server: RunningServer, send: Any, where: str, key: str, value: Any
) -> None:
    status, error = send(server, where, key, value)
    assert status == 400, error
    assert f"parameter '{key}' must be true or false" in error


def _set_param(params: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        params[key].bool_param = value
    elif isinstance(value, int):
        params[key].int64_param = value
    elif isinstance(value, float):
        params[key].double_param = value
    else:
        params[key].string_param = value


def _request_param_grpc(server: RunningServer, key: str, value: Any) -> tuple[int, str]:
    msg = _fp32_message()
    _set_param(msg.parameters, key, value)
    return _grpc_call(server, msg)


@pytest.mark.parametrize(
    "send",
    [lambda s, k, v: _flagged_http(s, "request", k, v), _request_param_grpc],
    ids=["http", "grpc"],
)
@pytest.mark.parametrize(
    ("key", "value"),
    [("timeout", "5"), ("timeout", -1), ("timeout", 1.5), ("timeout", True), ("priority", "1")],
)
def test_timeout_and_priority_parameters_are_integers(
    server: RunningServer, send: Any, key: str, value: Any
) -> None:
    status, error = send(server, key, value)
    assert status == 400, error
    assert f"request parameter '{key}' must be an integer" in error


# -- gRPC contents, strictly typed ------------------------------------------------------------


def _wrong_field() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="identity_fp32")
    t = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    t.contents.int_contents.append(2)
    return msg


def _wrong_field_empty() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="identity_fp32")
    t = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 0])
    t.contents.int_contents.append(2)
    return msg


def _two_fields() -> pb.ModelInferRequest:
    msg = _fp32_message()
    msg.inputs[0].contents.int64_contents.append(7)
    return msg


def _raw_and_contents() -> pb.ModelInferRequest:
    msg = _fp32_message()
    msg.raw_input_contents.append(np.array([1.5], np.float32).tobytes())
    return msg


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (_wrong_field, "FP32 data goes in contents.fp32_contents, not contents.int_contents"),
        (_wrong_field_empty, "not contents.int_contents"),
        (_two_fields, "not contents.int64_contents"),
        (_raw_and_contents, "has contents while the request sends raw_input_contents"),
    ],
    ids=["wrong-field", "wrong-field-empty-shape", "two-fields", "raw-and-contents"],
)
def test_grpc_contents_are_strictly_typed(server: RunningServer, build: Any, words: str) -> None:
    status, error = _grpc_call(server, build())
    assert status == 400, error
    assert "input 'INPUT0'" in error and words in error
    assert _grpc_call(server, _fp32_message()) == (200, "")


# -- raw sockets: h2c upgrade offers, encoded slashes ------------------------------------------


def _raw_http(server: RunningServer, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One request over a fresh socket, read to the server's close."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


FP32_JSON = orjson.dumps(FP32_BODY)
H2C = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)


def test_an_h2c_upgrade_offer_with_a_body_is_refused_clearly(server: RunningServer) -> None:
    """The body of an upgrade request would be lost (served empty before): a clear 400."""
    head = (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
        + H2C
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(FP32_JSON)
    )
    status, body = _raw_http(server, head, FP32_JSON)
    assert status == 400
    assert "HTTP upgrade requests with a body are not served" in orjson.loads(body)["error"]
    # Without a body the offer is merely declined: a health probe is served over HTTP/1.1.
    status, _ = _raw_http(
        server, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    )
    assert status == 200
    with server.client() as c:
        assert c.get("/v2/health/ready").status_code == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_to_http_url_gets_a_clear_answer(server: RunningServer) -> None:
    out = subprocess.run(
        [
            "curl", "-s", "--http2", "-o", "-", "-w", "\n%{http_code}",
            "-H", "Content-Type: application/json", "--data-binary", FP32_JSON.decode(),
            f"{server.url}/v2/models/identity_fp32/infer",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    body, _, code = out.stdout.rpartition("\n")
    assert code == "400", out
    assert "curl: --http1.1" in orjson.loads(body)["error"]


@pytest.mark.parametrize(
    "path",
    [
        b"/v2/models/identity_fp32%2Fversions%2F1/infer",  # once routed to version 1
        b"/v2/models/identity_fp32%2f1/infer",
        b"/v2/models/identity_fp32%2F1",
        b"/v2/models/identity_fp32%2Fready",
    ],
)
def test_an_encoded_slash_is_no_path_separator(server: RunningServer, path: bytes) -> None:
    method = b"POST" if path.endswith(b"/infer") else b"GET"
    head = (
        method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n" % len(FP32_JSON)
    )
    status, body = _raw_http(server, head, FP32_JSON if method == b"POST" else b"")
    assert status == 400
    assert "encoded '/' (%2F)" in orjson.loads(body)["error"]
    # An encoded character that is not a slash still routes (identity%5Ffp32 = identity_fp32).
    head = b"GET /v2/models/identity%5Ffp32/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    assert _raw_http(server, head)[0] == 200
