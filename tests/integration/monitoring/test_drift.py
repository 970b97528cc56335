"""Drift monitoring through a live server, over HTTP and gRPC: rows like the reference keep
the drift alert off; half a standard deviation of shift on 3 of 64 features turns it on,
visible in GET .../drift and the inferd_drift_* metrics, the health score untouched; the
admin endpoint sets a reference; a saturating load drops samples, counted, and every
request is answered; a bad reference.npz fails its model's load, naming the file."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.monitoring.reference import npz_bytes
from tests.support.async_infer import PROTOCOLS
from tests.support.drift_models import (
    FEATURES,
    SHIFTED,
    live_rows,
    reference_rows,
    write_drift_model,
)
from tests.support.metrics_scrape import scrape, value
from tests.support.servers import RunningServer, run_server

# Windows of 200 rows, evaluated every 100; the thread may use a whole core (no rests),
# so a test's rows are all tested once it has waited for the monitor's queue.
WATCHED = {"drift_window": "200", "drift_cpu_budget": "1", "drift_class_outputs": "label"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("drift_repo")
    for name in ("watched_http", "watched_grpc", "set_by_json"):
        write_drift_model(repo, name, WATCHED)
    # Rests 1000 times as long as it works: under load its queue fills and drops. One
    # request (4 rows) per batch: 768 batches, many more than its queue holds.
    write_drift_model(
        repo,
        "saturated",
        {"drift_window": "50", "drift_cpu_budget": "0.001"},
        max_batch_size=4,
    )
    write_drift_model(repo, "bad_reference", {}, npz_bytes({"label": np.zeros((20, 1))}))
    # Never resting either: a sample that arrives while the thread rests is dropped, and on
    # a busy host the rest after building the reference outlasts the next ten requests.
    write_drift_model(
        repo,
        "first_rows",
        {"drift_reference": "first:200", "drift_window": "100", "drift_cpu_budget": "1"},
    )
    (repo / "first_rows" / "1" / "reference.npz").unlink()
    write_drift_model(repo, "plain", {})
    (repo / "plain" / "1" / "reference.npz").unlink()
    with run_server(repo, admin_api=True) as running:
        yield running


def infer(server: RunningServer, protocol: str, model: str, rows: np.ndarray) -> None:
    if protocol == "http":
        doc = {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": list(rows.shape),
                    "data": rows.ravel().tolist(),
                }
            ]
        }
        r = httpx.post(f"{server.url}/v2/models/{model}/infer", json=doc, timeout=30)
        assert r.status_code == 200, r.text
        return
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        inp = grpcclient.InferInput("input", list(rows.shape), "FP32")
        inp.set_data_from_numpy(rows)
        client.infer(model, [inp])


def drift_of(server: RunningServer, model: str) -> dict[str, Any]:
    monitor = server.server.registry.get(model).drift
    assert monitor is not None
    monitor.wait_idle()  # every sample queued so far is tested
    r = httpx.get(f"{server.url}/v2/models/{model}/drift", timeout=30)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def checks_of(doc: dict[str, Any], tensor: str = "input") -> dict[str, Any]:
    (entry,) = [t for t in doc["tensors"] if t["name"] == tensor]
    tests: dict[str, Any] = entry["tests"]
    return tests


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_shift_on_3_of_64_features_alerts_and_leaves_health_alone(
    server: RunningServer, protocol: str
) -> None:
    model = f"watched_{protocol}"
    rng = np.random.default_rng(11)
    for _ in range(20):  # 400 rows like the reference: 3 windows
        infer(server, protocol, model, live_rows(rng, 20))
    calm = drift_of(server, model)
    assert calm["state"] == "monitoring" and calm["reference"] == {"source": "file"}
    assert calm["rows_seen"] == 400 and calm["samples_dropped"] == 0
    assert not calm["drifting"], checks_of(calm)
    assert checks_of(calm)["ks"]["alerting"] is False
    before = scrape(server)
    labels = {"model": model, "version": "1"}
    assert value(before, "inferd_drift_alerting", **labels, tensor="input", test="ks") == 0

    for _ in range(20):  # 400 shifted rows: the last windows hold nothing else
        infer(server, protocol, model, live_rows(rng, 20, shift=0.5))
    doc = drift_of(server, model)
    ks = checks_of(doc)["ks"]
    assert doc["drifting"] and ks["alerting"], ks
    assert int(ks["worst_column"]) in SHIFTED
    (entry,) = [t for t in doc["tensors"] if t["name"] == "input"]
    assert len(entry["columns"]) == FEATURES
    worst = sorted(entry["columns"], key=lambda c: c["ks"])[-3:]
    assert {int(c["column"]) for c in worst} == set(SHIFTED)
    after = scrape(server)
    assert value(after, "inferd_drift_alerting", **labels, tensor="input", test="ks") == 1
    assert value(after, "inferd_drift_score", **labels, tensor="input", test="ks") > 0.2
    assert value(after, "inferd_drift_p_value", **labels, tensor="input", test="ks") < 0.001
    # Drift is not an outage: the version stays ready, no request failed, and its health
    # score (latency, throughput, errors: docs/metrics.md) is the same with drift alerting
    # and without: scored at one clock reading from the same outcomes (no request in
    # between), before and after the admin reference below turns the alert off.
    assert httpx.get(f"{server.url}/v2/models/{model}/ready").status_code == 200
    assert not any(
        n == "inferd_request_failure_total" and dict(k).get("model") == model for n, k in after
    )
    sink = server.server.metrics
    assert sink is not None
    at = time.monotonic()
    alerting_score = sink.health_score(model, "1", None, now=at)
    assert alerting_score == sink.health_score(model, "1", None, now=at)  # scoring is pure

    # A new reference through the admin endpoint (an .npz body): the windows start again.
    shifted = reference_rows(2000, seed=3)
    shifted[:, SHIFTED] += 0.5
    r = httpx.post(
        f"{server.url}/v2/models/{model}/versions/1/drift/reference",
        content=npz_bytes({"input": shifted}),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["reference"] == {"source": "admin"}
    assert not drift_of(server, model)["drifting"]  # the windows start again: no alert
    assert sink.health_score(model, "1", None, now=at) == alerting_score
    for _ in range(20):
        infer(server, protocol, model, live_rows(rng, 20, shift=0.5))
    assert not checks_of(drift_of(server, model))["ks"]["alerting"]


def test_the_first_rows_served_become_the_reference(server: RunningServer) -> None:
    assert drift_of(server, "first_rows")["state"] == "collecting_reference"
    rng = np.random.default_rng(12)
    for _ in range(10):  # 200 rows: the reference
        infer(server, "http", "first_rows", live_rows(rng, 20))
    doc = drift_of(server, "first_rows")
    assert doc["state"] == "monitoring" and doc["reference"] == {"source": "first:200"}
    (entry,) = [t for t in doc["tensors"] if t["name"] == "input"]
    assert entry["reference_rows"] == 200
    for _ in range(10):  # shifted: the next windows see it
        infer(server, "http", "first_rows", live_rows(rng, 20, shift=1.0))
    shifted = drift_of(server, "first_rows")
    assert shifted["samples_dropped"] == 0, shifted
    assert checks_of(shifted)["ks"]["alerting"]


def test_a_model_without_a_reference_is_not_monitored(server: RunningServer) -> None:
    assert server.server.registry.get("plain").drift is None
    r = httpx.get(f"{server.url}/v2/models/plain/versions/1/drift")
    assert r.json() == {"model": "plain", "version": "1", "state": "off", "tensors": []}
    assert httpx.get(f"{server.url}/v2/models/nope/drift").status_code == 404


def test_the_drift_report_over_grpc_is_the_http_one(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary("/inferd.admin.v1.Admin/GetDrift")
        doc = json.loads(call(json.dumps({"model": "watched_grpc", "version": "1"}).encode()))
        assert doc == drift_of(server, "watched_grpc")
        with pytest.raises(grpc.RpcError) as info:
            call(json.dumps({"model": "nope"}).encode())
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_json_reference_and_its_errors(server: RunningServer) -> None:
    url = f"{server.url}/v2/models/set_by_json/drift/reference"
    rows = reference_rows(50).tolist()
    r = httpx.post(url, json={"tensors": {"input": rows}}, timeout=30)
    assert r.status_code == 200, r.text
    for body, words in [
        ({"tensors": {"input": [row[:10] for row in rows]}}, ["'input'", "10 values per row"]),
        ({"tensors": {"nope": rows}}, ["'nope'", "not an input or output"]),
        ({"tensors": {}}, ["'tensors'"]),
        ({"tensors": {"input": [[1, 2], [3]]}}, ["'tensors.input'", "different shapes"]),
    ]:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400, r.text
        for word in words:
            assert word in r.json()["error"]
    r = httpx.post(url, content=b"not an npz", timeout=30)
    assert r.status_code == 400 and "not a readable .npz" in r.json()["error"]


def test_the_admin_endpoint_follows_the_admin_rules(tmp_path: Path) -> None:
    write_drift_model(tmp_path, "m", WATCHED)
    with run_server(tmp_path) as running:  # --model-control-mode none: no admin API
        url = f"{running.url}/v2/models/m/drift/reference"
        r = httpx.post(url, json={"tensors": {"input": reference_rows(20).tolist()}})
        assert r.status_code == 403 and "--admin-api" in r.json()["error"]
        assert httpx.get(f"{running.url}/v2/models/m/drift").status_code == 200


def test_a_saturating_load_drops_samples_and_answers_every_request(
    server: RunningServer,
) -> None:
    rows = live_rows(np.random.default_rng(5), 4).ravel().tolist()
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [4, FEATURES], "data": rows}]}

    async def load() -> list[int]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as c:

            async def client() -> list[int]:
                return [
                    (await c.post("/v2/models/saturated/infer", json=doc)).status_code
                    for _ in range(12)
                ]

            answers = await asyncio.gather(*(client() for _ in range(64)))
        return [s for a in answers for s in a]

    statuses = asyncio.run(load())
    assert statuses == [200] * (64 * 12)
    samples = scrape(server)
    labels = {"model": "saturated", "version": "1"}
    dropped = value(samples, "inferd_drift_samples_dropped_total", **labels)
    queued = value(samples, "inferd_drift_samples_total", **labels)
    executed = value(samples, "inferd_execution_count_total", **labels)
    # Every executed batch was offered once and either queued or dropped: never waited for.
    assert dropped > 0
    assert queued + dropped == executed


def test_a_bad_reference_fails_its_load_naming_the_file(server: RunningServer) -> None:
    index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
    (row,) = [m for m in index if m["name"] == "bad_reference"]
    assert row["state"] == "UNAVAILABLE"
    assert "bad_reference/1/reference.npz" in row["reason"]
    assert "input 'input' is missing" in row["reason"]
    assert httpx.get(f"{server.url}/v2/models/watched_http/ready").status_code == 200
