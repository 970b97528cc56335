"""One table of cases, run over both HTTP and gRPC with Triton's own clients.

Both adapters sit on one DataPlane: the same request must give the same answer, the same
error kind and the same message over either protocol.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.fault_models import GATED, GATED_MAX_BATCH, blocker_is_executing
from tests.support.infer_samples import sample
from tests.support.models import ONNX_TYPES
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, batcher_of, wait_for


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


def f32(*shape: int, value: float = 0.25) -> np.ndarray:
    return np.full(shape, value, dtype=np.float32)


MLP_OK = {"input": (f32(1, 8), "FP32")}

# (id, model, inputs, extra infer kwargs, HTTP status, gRPC code, words in the message)
ERRORS: list[tuple[str, str, dict[str, Any], dict[str, Any], str, str, list[str]]] = [
    ("unknown model", "nope", MLP_OK, {}, "404", "NOT_FOUND", ["unknown model 'nope'"]),
    ("unknown version", "mlp", MLP_OK, {"model_version": "9"}, "404", "NOT_FOUND", ["version '9'"]),
    (
        "wrong datatype",
        "mlp",
        {"input": (np.zeros((1, 8)), "FP64")},
        {},
        "400",
        "INVALID_ARGUMENT",
        ["input 'input'", "FP64", "FP32"],
    ),
    (
        "wrong shape",
        "mlp",
        {"input": (f32(1, 7), "FP32")},
        {},
        "400",
        "INVALID_ARGUMENT",
        ["input 'input'", "[1, 7]", "[-1, 8]"],
    ),
    (
        "no batch dimension",
        "mlp",
        {"input": (f32(8), "FP32")},
        {},
        "400",
        "INVALID_ARGUMENT",
        ["input 'input'", "[-1, 8]"],
    ),
    (
        "unexpected input",
        "mlp",
        {"other": (f32(1, 8), "FP32")},
        {},
        "400",
        "INVALID_ARGUMENT",
        ["unexpected input 'other'"],
    ),
    (
        "batch over max",
        "mlp",
        {"input": (f32(9, 8), "FP32")},
        {},
        "400",
        "INVALID_ARGUMENT",
        ["batch size 9", "max_batch_size"],
    ),
    (
        "unknown output",
        "mlp",
        MLP_OK,
        {"outputs": ["logits"]},
        "400",
        "INVALID_ARGUMENT",
        ["output 'logits'"],
    ),
    (
        "output requested twice",
        "mlp",
        MLP_OK,
        {"outputs": ["label", "probabilities", "label"]},
        "400",
        "INVALID_ARGUMENT",
        ["output 'label' is requested more than once"],
    ),
    (
        "model raises",
        "faulty",
        {"IN": (f32(1, 4, value=-1), "FP32")},
        {},
        "500",
        "INTERNAL",
        ["faulty", "negative input is not allowed"],
    ),
    (
        "model breaks batch",
        "faulty",
        {"IN": (f32(2, 4, value=5000), "FP32")},
        {},
        "500",
        "INTERNAL",
        ["output 'OUT' has batch size 1"],
    ),
    (
        "model unavailable",
        "load_fails",
        {"IN": (f32(1, 4), "FP32")},
        {},
        "503",
        "UNAVAILABLE",
        ["no such weights"],
    ),
    (
        "request too large",
        "identity_fp32",
        {"INPUT0": (f32(1, 300_000), "FP32")},
        {},
        "413",
        "RESOURCE_EXHAUSTED",
        [],
    ),
]


@pytest.mark.parametrize(
    ("model", "tensors", "kwargs", "http_status", "grpc_code", "words"),
    [c[1:] for c in ERRORS],
    ids=[c[0] for c in ERRORS],
)
def test_error_then_success(
    client: Client,
    model: str,
    tensors: dict[str, Any],
    kwargs: dict[str, Any],
    http_status: str,
    grpc_code: str,
    words: list[str],
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, tensors, **kwargs)
    expected = http_status if client.protocol == "http" else f"StatusCode.{grpc_code}"
    assert info.value.status() == expected, info.value.message()
    for word in words:
        assert word in info.value.message()
    result = client.infer("mlp", MLP_OK)  # and the server still serves
    assert result.as_numpy("probabilities").shape == (1, 4)


@pytest.mark.parametrize("datatype", list(ONNX_TYPES))
def test_every_datatype(client: Client, datatype: str) -> None:
    data = sample(datatype, (2, 7), seed=5)
    got = client.infer(f"identity_{datatype.lower()}", {"INPUT0": (data, datatype)}).as_numpy(
        "OUTPUT0"
    )
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


def test_health_metadata_and_config(client: Client) -> None:
    assert client.raw.is_server_live()
    assert not client.raw.is_server_ready()  # strict: the broken models are not ready
    assert client.raw.is_model_ready("mlp")
    assert not client.raw.is_model_ready("load_fails")
    if client.protocol == "http":
        meta = client.raw.get_model_metadata("mlp")
        config = client.raw.get_model_config("mlp")
        index = client.raw.get_model_repository_index()
    else:
        meta = client.raw.get_model_metadata("mlp", as_json=True)
        config = client.raw.get_model_config("mlp", as_json=True)["config"]
        index = client.raw.get_model_repository_index(as_json=True)["models"]
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"][0]["datatype"] == "FP32"
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, 8]
    assert int(config["max_batch_size"]) == 8
    assert config["input"][0]["name"] == "input"
    states = {(r["name"], r.get("version", "")): r.get("state") for r in index}
    assert states[("mlp", "2")] == "READY"
    assert states[("load_fails", "1")] == "UNAVAILABLE"


def test_same_input_gives_byte_identical_outputs(server: RunningServer) -> None:
    data = np.random.default_rng(7).normal(size=(3, 8)).astype(np.float32)
    results = {}
    for protocol in PROTOCOLS:
        c = Client(protocol, server)
        results[protocol] = c.infer("mlp", {"input": (data, "FP32")})
        c.raw.close()
    json_client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    inp = httpclient.InferInput("input", [3, 8], "FP32")
    inp.set_data_from_numpy(data, binary_data=False)
    outs = [
        httpclient.InferRequestedOutput(n, binary_data=False) for n in ("probabilities", "label")
    ]
    results["http-json"] = json_client.infer("mlp", [inp], outputs=outs)
    json_client.close()
    for name in ("probabilities", "label"):
        reference = results["grpc"].as_numpy(name)
        for protocol in ("http", "http-json"):
            other = results[protocol].as_numpy(name)
            assert other.dtype == reference.dtype
            assert other.tobytes() == reference.tobytes(), (protocol, name)


def test_grpc_async_infer_batches(gated_server: RunningServer, gate: Path) -> None:
    # A blocker holds the model's one instance until all n async requests are queued; then
    # they leave as one batch, however slowly the client sent them.
    c = Client("grpc", gated_server)
    answers: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
    n = 48
    assert n <= GATED_MAX_BATCH
    batcher = batcher_of(gated_server, GATED)
    gate.touch()  # closed: the blocker will hold the instance

    def send(value: int, request_id: str) -> None:
        inputs = c.inputs({"IN": (np.full((1, 2), value, np.float32), "FP32")})
        c.raw.async_infer(
            GATED,
            inputs,
            lambda result, error: answers.put((request_id, result, error)),
            request_id=request_id,
        )

    try:
        send(-1, "blocker")
        wait_for(batcher, blocker_is_executing, "the blocker to execute")
        for i in range(n):
            send(i, str(i))
        wait_for(batcher, lambda b: b.queue_depth() == n, f"{n} queued requests")
    finally:
        gate.unlink()  # open: never leave the instance held, even when failing
    results = {}
    for _ in range(n + 1):
        request_id, result, error = answers.get(timeout=30)
        assert error is None, error
        assert result.get_response().id == request_id
        results[request_id] = result
    c.raw.close()
    blocker = results.pop("blocker")
    executions = set()
    for i in range(n):
        result = results[str(i)]
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.full((1, 2), i))
        assert int(result.as_numpy("BATCH")[0, 0]) == n
        executions.add(int(result.as_numpy("EXEC")[0, 0]))
    assert len(executions) == 1, f"{n} queued requests ran as {len(executions)} executions"
    assert int(blocker.as_numpy("EXEC")[0, 0]) not in executions
    assert int(blocker.as_numpy("BATCH")[0, 0]) == 1


def test_grpc_stream_answers_each_request_with_its_id(server: RunningServer) -> None:
    c = Client("grpc", server)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.raw.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i in range(20):
        # Request 7 asks for a model that doesn't exist. (Not a failing input: a batch that
        # fails, fails every request merged into it, so the count of errors would vary.)
        inputs = c.inputs({"IN": (np.full((1, 4), float(i), np.float32), "FP32")})
        c.raw.async_stream_infer("nope" if i == 7 else "faulty", inputs, request_id=f"s{i}")
    ok: dict[str, np.ndarray] = {}
    errors = []
    for _ in range(20):
        result, error = answers.get(timeout=20)
        if error is not None:
            errors.append(error)
        else:
            ok[result.get_response().id] = result.as_numpy("OUT")
    c.raw.stop_stream()
    c.raw.close()
    assert len(errors) == 1 and "unknown model 'nope'" in str(errors[0])
    assert sorted(ok) == sorted(f"s{i}" for i in range(20) if i != 7)
    for i in range(20):
        if i != 7:
            np.testing.assert_array_equal(ok[f"s{i}"], np.full((1, 4), 2.0 * i))
