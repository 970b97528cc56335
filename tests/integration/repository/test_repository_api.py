"""Explicit control mode: load and unload through Triton's repository API (HTTP and gRPC)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import plus, write_plus_model
from tests.support.security import ADMIN_TOKEN, AUTH
from tests.support.servers import RunningServer, run_server

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("explicit_repo")
    write_plus_model(repo, "first", [1])
    write_plus_model(repo, "second", [1, 2])
    write_plus_model(repo, "third", [5])
    # Uploads of code are allowed here (a failing model.py below), so a credential is due.
    with run_server(
        repo,
        model_control_mode="explicit",
        load_models=("first",),
        admin_token=ADMIN_TOKEN,
        model_upload="code",
    ) as running:
        yield running


def test_only_the_named_models_load_at_start(explicit_server: RunningServer) -> None:
    with explicit_server.client(headers=AUTH) as c:
        rows = c.post("/v2/repository/index").json()
        assert c.get("/v2/health/ready").status_code == 200
    assert {"name": "first", "version": "1", "state": "READY"} in rows
    assert {"name": "second"} in rows  # on disk, not loaded: listed by name, as Triton does


def test_load_infer_unload_over_http(explicit_server: RunningServer) -> None:
    with explicit_server.client(headers=AUTH) as c:
        assert c.post("/v2/models/second/infer", json=BODY).status_code == 404
        assert c.post("/v2/repository/models/second/load").status_code == 200
        doc = c.post("/v2/models/second/infer", json=BODY).json()
        assert doc["model_version"] == "2"
        assert c.post("/v2/repository/models/second/unload").status_code == 200
        r = c.post("/v2/models/second/infer", json=BODY)
        assert r.status_code == 503
        assert "unloaded" in r.json()["error"]
        rows = c.post("/v2/repository/index").json()
        assert {"name": "second", "state": "UNAVAILABLE", "reason": "unloaded"} in rows
        assert c.get("/v2/health/ready").status_code == 200  # unloading on request is fine


def test_load_with_a_config_override(explicit_server: RunningServer) -> None:
    config = {
        "name": "third",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 2,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    with explicit_server.client(headers=AUTH) as c:
        r = c.post(
            "/v2/repository/models/third/load", json={"parameters": {"config": json.dumps(config)}}
        )
        assert r.status_code == 200, r.text
        assert c.get("/v2/models/third/config").json()["max_batch_size"] == 2
        too_big = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": [0] * 12}]}
        assert c.post("/v2/models/third/infer", json=too_big).status_code == 400


def test_load_from_uploaded_files(explicit_server: RunningServer) -> None:
    config = {
        "name": "uploaded",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    onnx_bytes = plus(7.0).SerializeToString()
    params = {
        "config": json.dumps(config),
        "file:1/model.onnx": base64.b64encode(onnx_bytes).decode(),
    }
    with explicit_server.client(headers=AUTH) as c:
        assert (
            c.post("/v2/repository/models/uploaded/load", json={"parameters": params}).status_code
            == 200
        )
        doc = c.post("/v2/models/uploaded/infer", json=BODY).json()
    assert doc["outputs"][0]["data"] == [7.0] * 4


def test_a_version_that_fails_to_load_fails_the_call_and_the_old_keeps_serving(
    explicit_server: RunningServer,
) -> None:
    # The config is fine; the model only fails when its instance loads (a Python model
    # whose import fails), after the config checks that already answered 400.
    config = {
        "name": "first",
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    params = {
        "config": json.dumps(config),
        "file:1/model.py": base64.b64encode(b"raise ImportError('no such weights')").decode(),
    }
    with explicit_server.client(headers=AUTH) as c:
        before = c.post("/v2/models/first/infer", json=BODY).json()["outputs"][0]["data"]
        r = c.post("/v2/repository/models/first/load", json={"parameters": params})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "model 'first' failed to load: version 1: load failed" in error
        assert "no such weights" in error
        assert "still serving version 1" in error
        after = c.post("/v2/models/first/infer", json=BODY)
        assert after.status_code == 200
        assert after.json()["outputs"][0]["data"] == before


@pytest.mark.parametrize(
    ("name", "params", "status", "words"),
    [
        ("missing", {}, 404, ["no model 'missing'"]),
        (".hidden", {}, 400, ["invalid model name"]),
        ("first", {"config": "{not json"}, 400, ["'config' parameter"]),
        ("first", {"surprise": 1}, 400, ["unknown load parameter 'surprise'"]),
        ("x", {"file:1/model.onnx": "AAAA"}, 400, ["'config' parameter as well"]),
        ("x", {"config": "{}", "file:../../evil": "AAAA"}, 400, ["outside the model directory"]),
    ],
)
def test_bad_loads_are_clear_errors(
    explicit_server: RunningServer, name: str, params: dict[str, str], status: int, words: list[str]
) -> None:
    with explicit_server.client(headers=AUTH) as c:
        before = c.post("/v2/repository/index").json()
        r = c.post(f"/v2/repository/models/{name}/load", json={"parameters": params})
        assert r.status_code == status, r.text
        for word in words:
            assert word in r.json()["error"]
        assert c.post("/v2/models/first/infer", json=BODY).status_code == 200
        # A refused load leaves nothing behind: no entry holds server readiness down.
        assert c.get("/v2/health/ready").status_code == 200
        names = {row["name"] for row in c.post("/v2/repository/index").json()}
        assert names == {row["name"] for row in before}


def test_load_and_unload_over_grpc(explicit_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_address)
    client.load_model("second", headers=AUTH)
    assert client.is_model_ready("second")
    client.unload_model("second", headers=AUTH)
    assert not client.is_model_ready("second")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("missing", headers=AUTH)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    client.close()


def test_repository_api_is_off_outside_explicit_mode(tmp_path: Path) -> None:
    write_plus_model(tmp_path, "only", [1])
    with run_server(tmp_path) as running:
        with running.client() as c:
            r = c.post("/v2/repository/models/only/unload")
        assert r.status_code == 403
        client = grpcclient.InferenceServerClient(running.grpc_address)
        with pytest.raises(InferenceServerException) as info:
            client.unload_model("only")
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert client.is_model_ready("only")
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unloading_dependents_is_refused_not_ignored(
    explicit_server: RunningServer, protocol: str
) -> None:
    """Triton's `unload_dependents: true` would unload the ensembles made of the model;
    inferd does not, so it refuses it (naming it) and unloads nothing, while tritonclient's
    default (`false`) unloads as before."""
    client: Any = (
        httpclient.InferenceServerClient(explicit_server.url.removeprefix("http://"))
        if protocol == "http"
        else grpcclient.InferenceServerClient(explicit_server.grpc_address)
    )
    try:
        client.load_model("third", headers=AUTH)
        with pytest.raises(InferenceServerException) as info:
            client.unload_model("third", headers=AUTH, unload_dependents=True)
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert "'unload_dependents' must be false" in str(info.value.message())
        assert client.is_model_ready("third")
        client.unload_model("third", headers=AUTH)  # unload_dependents=False, as sent
        assert not client.is_model_ready("third")
    finally:
        client.close()


def test_an_unknown_unload_parameter_is_a_400(explicit_server: RunningServer) -> None:
    with explicit_server.client(headers=AUTH) as c:
        r = c.post("/v2/repository/models/first/unload", json={"parameters": {"surprise": 1}})
        assert r.status_code == 400
        assert "unknown unload parameter 'surprise'" in r.json()["error"]
        r = c.post("/v2/repository/models/first/unload", json={"parameters": []})
        assert r.status_code == 400
        assert "'parameters' must be an object" in r.json()["error"]
        assert c.post("/v2/models/first/infer", json=BODY).status_code == 200
