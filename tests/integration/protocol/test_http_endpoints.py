"""Every HTTP endpoint against a real server over loopback."""

from __future__ import annotations

import json

import httpx

from tests.support.servers import RunningServer


def test_live_and_server_metadata(server: RunningServer) -> None:
    with server.client() as c:
        assert c.get("/v2/health/live").status_code == 200
        meta = c.get("/v2").json()
    assert meta["name"] == "inferd"
    assert "binary_tensor_data" in meta["extensions"]


def test_ready_is_strict_when_a_model_failed(server: RunningServer) -> None:
    # The repository holds broken models: like Triton's strict readiness, the server is
    # not ready, while each good model is.
    with server.client() as c:
        assert c.get("/v2/health/ready").status_code == 503
        assert c.get("/v2/models/mlp/ready").status_code == 200
        assert c.get("/v2/models/mlp/versions/2/ready").status_code == 200
        assert c.get("/v2/models/inconsistent/ready").status_code == 503
        assert c.get("/v2/models/nope/ready").status_code == 404


def test_ready_when_every_model_loaded(good_repository) -> None:  # type: ignore[no-untyped-def]
    from tests.support.servers import run_server

    with run_server(good_repository) as running, running.client() as c:
        assert c.get("/v2/health/ready").status_code == 200


def test_model_metadata_has_batch_dimension(server: RunningServer) -> None:
    with server.client() as c:
        meta = c.get("/v2/models/mlp").json()
        fixed = c.get("/v2/models/fixed").json()
    assert meta == {
        "name": "mlp",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "label", "datatype": "INT64", "shape": [-1, 1]},
        ],
    }
    # max_batch_size 0 (a fixed leading dimension): no batch dimension is added.
    assert fixed["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3]}]


def test_version_metadata_and_unknown_version(server: RunningServer) -> None:
    with server.client() as c:
        assert c.get("/v2/models/mlp/versions/1").json()["versions"] == ["1"]
        r = c.get("/v2/models/mlp/versions/7")
    assert r.status_code == 404
    assert "version '7'" in r.json()["error"]


def test_model_config_is_triton_json(server: RunningServer) -> None:
    with server.client() as c:
        cfg = c.get("/v2/models/mlp/config").json()
        auto = c.get("/v2/models/identity_fp32/config").json()
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [8]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    # Completed from the ONNX file: batching inferred from the variable leading dim.
    assert auto["platform"] == "onnxruntime_onnx"
    assert auto["max_batch_size"] == 4
    assert auto["input"][0]["dims"] == [-1]
    assert "dynamic_batching" in auto
    assert auto["instance_group"][0]["count"] == 1


def test_repository_index_states_and_reasons(server: RunningServer) -> None:
    with server.client() as c:
        rows = c.post("/v2/repository/index").json()
        ready_rows = c.post("/v2/repository/index", content=json.dumps({"ready": True})).json()
    by_name = {(r["name"], r.get("version")): r for r in rows}
    assert by_name[("mlp", "1")]["state"] == "READY"
    assert by_name[("mlp", "2")]["state"] == "READY"
    broken = by_name[("broken_syntax", None)]
    assert broken["state"] == "UNAVAILABLE"
    assert "broken_syntax/config.pbtxt" in broken["reason"]
    inconsistent = by_name[("inconsistent", None)]
    assert "inconsistent/config.pbtxt" in inconsistent["reason"]
    assert "input 'x'" in inconsistent["reason"]
    assert "TYPE_FP64" in inconsistent["reason"]
    failed = by_name[("load_fails", "1")]
    assert failed["state"] == "UNAVAILABLE"
    assert "no such weights" in failed["reason"]
    assert all(r["state"] == "READY" for r in ready_rows)
    assert {r["name"] for r in ready_rows} >= {"mlp", "counter", "identity_bytes"}


def test_infer_unavailable_model_is_503_with_reason(server: RunningServer) -> None:
    with server.client() as c:
        r = c.post(
            "/v2/models/load_fails/infer",
            json={"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]},
        )
    assert r.status_code == 503
    assert "no such weights" in r.json()["error"]


def test_unknown_route_is_json_404(server: RunningServer) -> None:
    with server.client() as c:
        r = c.get("/v3/nothing")
    assert r.status_code == 404
    assert "error" in r.json()


def test_infer_echoes_id_and_selects_outputs(server: RunningServer) -> None:
    body = {
        "id": "req-42",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 8], "data": [0.5] * 16}],
        "outputs": [{"name": "label"}],
    }
    with server.client() as c:
        r = c.post("/v2/models/mlp/versions/1/infer", json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"] == "req-42"
    assert doc["model_name"] == "mlp"
    assert doc["model_version"] == "1"
    assert [o["name"] for o in doc["outputs"]] == ["label"]
    assert doc["outputs"][0]["shape"] == [2, 1]


def test_request_without_version_goes_to_latest(server: RunningServer) -> None:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [1] * 8}]}
    with server.client() as c:
        latest = c.post("/v2/models/mlp/infer", json=body).json()
        v1 = c.post("/v2/models/mlp/versions/1/infer", json=body).json()
    assert latest["model_version"] == "2"
    # Different seeds: the two versions really are different models.
    assert latest["outputs"][0]["data"] != v1["outputs"][0]["data"]


def test_model_print_goes_to_log_not_response(server: RunningServer, caplog) -> None:  # type: ignore[no-untyped-def]
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    with caplog.at_level("INFO", logger="inferd.model.faulty"), server.client() as c:
        r = c.post("/v2/models/faulty/infer", json=body)
    assert r.status_code == 200
    assert "faulty model saw" not in r.text
    assert r.json()["outputs"][0]["data"] == [2, 4, 6, 8]
    assert any("faulty model saw a batch of 1" in rec.getMessage() for rec in caplog.records)
    assert all(rec.name == "inferd.model.faulty" for rec in caplog.records)


def test_keep_alive_connection_survives_errors(server: RunningServer) -> None:
    # Many requests on one connection, errors in between: the server stays up.
    with httpx.Client(base_url=server.url) as c:
        for _ in range(3):
            assert c.post("/v2/models/mlp/infer", content=b"{").status_code == 400
            assert c.get("/v2/health/live").status_code == 200
