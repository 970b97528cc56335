"""Every bad request gets a clear error with the right status; the server keeps serving."""

from __future__ import annotations

import json
import struct

import httpx
import pytest

from tests.support.servers import RunningServer

GOOD = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.1] * 8}]}


def _inp(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "input",
        "datatype": "FP32",
        "shape": [1, 8],
        "data": [0.1] * 8,
    }
    base.update(overrides)
    return base


def _binary(
    header: dict[str, object], payload: bytes, declared: int | None = None
) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    length = len(head) if declared is None else declared
    return head + payload, {"Inference-Header-Content-Length": str(length)}


FLOATS8 = struct.pack("<8f", *range(8))

# (case id, path, body bytes, extra headers, status, words the message must contain)
CASES: list[tuple[str, str, bytes, dict[str, str], int, list[str]]] = [
    ("unknown model", "/v2/models/nope/infer", json.dumps(GOOD).encode(), {}, 404, ["nope"]),
    (
        "unknown version",
        "/v2/models/mlp/versions/9/infer",
        json.dumps(GOOD).encode(),
        {},
        404,
        ["version '9'"],
    ),
    ("malformed json", "/v2/models/mlp/infer", b'{"inputs": [', {}, 400, ["malformed JSON"]),
    ("body not object", "/v2/models/mlp/infer", b"[1, 2]", {}, 400, ["object"]),
    ("no inputs", "/v2/models/mlp/infer", b'{"inputs": []}', {}, 400, ["inputs"]),
    (
        "wrong datatype",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(datatype="FP64")]}).encode(),
        {},
        400,
        ["input 'input'", "FP64", "FP32"],
    ),
    (
        "unknown datatype",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(datatype="FLOAT")]}).encode(),
        {},
        400,
        ["input 'input'", "FLOAT"],
    ),
    (
        "wrong shape",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(shape=[1, 7], data=[0] * 7)]}).encode(),
        {},
        400,
        ["input 'input'", "[1, 7]", "[-1, 8]"],
    ),
    (
        "no batch dim",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(shape=[8])]}).encode(),
        {},
        400,
        ["input 'input'", "[-1, 8]"],
    ),
    (
        "data count mismatch",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(data=[0] * 7)]}).encode(),
        {},
        400,
        ["input 'input'", "7", "8"],
    ),
    (
        "data not numbers",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(data=["x"] * 8)]}).encode(),
        {},
        400,
        ["input 'input'", "FP32"],
    ),
    (
        "missing input",
        "/v2/models/counter/infer",
        json.dumps({"inputs": []}).encode(),
        {},
        400,
        ["inputs"],
    ),
    (
        "missing required input",
        "/v2/models/mlp/infer",
        json.dumps(
            {"inputs": [{"name": "other", "datatype": "FP32", "shape": [1], "data": [1]}]}
        ).encode(),
        {},
        400,
        ["unexpected input 'other'", "input"],
    ),
    (
        "duplicate input",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(), _inp()]}).encode(),
        {},
        400,
        ["input 'input'", "more than once"],
    ),
    (
        "batch over max",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [_inp(shape=[9, 8], data=[0] * 72)]}).encode(),
        {},
        400,
        ["input 'input'", "batch size 9", "max_batch_size"],
    ),
    (
        "unknown output",
        "/v2/models/mlp/infer",
        json.dumps({**GOOD, "outputs": [{"name": "logits"}]}).encode(),
        {},
        400,
        ["output 'logits'", "probabilities"],
    ),
    (
        "truncated binary",
        "/v2/models/mlp/infer",
        *_binary(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": [1, 8],
                        "parameters": {"binary_data_size": 32},
                    }
                ]
            },
            FLOATS8[:20],
        ),
        400,
        ["input 'input'", "binary_data_size 32"],
    ),
    (
        "binary size wrong for shape",
        "/v2/models/mlp/infer",
        *_binary(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": [1, 8],
                        "parameters": {"binary_data_size": 28},
                    }
                ]
            },
            FLOATS8[:28],
        ),
        400,
        ["input 'input'", "28 bytes", "32"],
    ),
    (
        "extra binary bytes",
        "/v2/models/mlp/infer",
        *_binary(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": [1, 8],
                        "parameters": {"binary_data_size": 32},
                    }
                ]
            },
            FLOATS8 + b"xx",
        ),
        400,
        ["2 bytes more"],
    ),
    (
        "header length past body",
        "/v2/models/mlp/infer",
        *_binary(GOOD, b"", declared=10_000),  # type: ignore[arg-type]
        400,
        ["Inference-Header-Content-Length"],
    ),
    (
        "header length not a number",
        "/v2/models/mlp/infer",
        json.dumps(GOOD).encode(),
        {"Inference-Header-Content-Length": "abc"},
        400,
        ["Inference-Header-Content-Length"],
    ),
    (
        "model raises",
        "/v2/models/faulty/infer",
        json.dumps(
            {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [-1, 0, 0, 0]}]}
        ).encode(),
        {},
        500,
        ["faulty", "negative input is not allowed"],
    ),
    (
        "model breaks batch contract",
        "/v2/models/faulty/infer",
        json.dumps(
            {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2, 4], "data": [5000] * 8}]}
        ).encode(),
        {},
        500,
        ["faulty", "OUT"],
    ),
    (
        "body too large",
        "/v2/models/mlp/infer",
        b"{" + b" " * (1024 * 1024 + 10) + b"}",
        {},
        413,
        ["exceeds the limit"],
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "words"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_error_then_success(
    server: RunningServer,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    words: list[str],
) -> None:
    with server.client() as c:
        r = c.post(path, content=body, headers={"Content-Type": "application/json", **headers})
        assert r.status_code == status, r.text
        message = r.json()["error"]
        for word in words:
            assert word in message, f"{word!r} not in {message!r}"
        # The server is still up and serving on the same connection.
        ok = c.post("/v2/models/mlp/infer", json=GOOD)
        assert ok.status_code == 200, ok.text


def test_body_too_large_without_content_length(server: RunningServer) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(20):
            yield b" " * 65536

    with httpx.Client(base_url=server.url) as c:
        r = c.post("/v2/models/mlp/infer", content=chunks())
    assert r.status_code == 413
    assert "exceeds the limit" in r.json()["error"]


def test_wrong_method_is_json_error(server: RunningServer) -> None:
    with server.client() as c:
        r = c.get("/v2/models/mlp/infer")
    assert r.status_code == 405
    assert "error" in r.json()
