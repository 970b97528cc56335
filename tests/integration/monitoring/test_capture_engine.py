"""Capture and feedback with `--engine`: the engine sees every request, so it samples and
joins labels; a request's inputs arrive there as views of the front end's slab, which the
front end reuses once the answer is back, so what the capture keeps must be its own copy.
Many requests over one connection (one front end, the same slab regions again and again),
then the captures load back equal to what was sent."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.monitoring.capture_files import load_capture
from tests.support.monitoring_models import parameters, write_signed_model
from tests.support.servers import free_port, run_cli_server

REQUESTS = 40


def _send_http(url: str, xs: list[np.ndarray]) -> list[str]:
    ids = []
    with httpx.Client(base_url=url, timeout=30) as client:  # one connection: one front end
        for x in xs:
            doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                               "data": x.ravel().tolist()}]}  # fmt: skip
            r = client.post("/v2/models/all/infer", json=doc)
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
    return ids


def _send_grpc(address: str, xs: list[np.ndarray]) -> list[str]:
    client = grpcclient.InferenceServerClient(address)  # one channel: one front end
    ids = []
    try:
        for x in xs:
            tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            ids.append(client.infer("all", [tensor]).get_response().id)
    finally:
        client.close()
    return ids


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_captures_through_the_engine_are_what_was_sent(tmp_path: Path, protocol: str) -> None:
    repo, captures = tmp_path / "repo", tmp_path / "captures"
    write_signed_model(repo, "all", extra=parameters(capture_sample_rate=1))
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(REQUESTS)]
    grpc_port = free_port()
    with run_cli_server(
        repo, tmp_path / "server.log", "--workers", "1", "--engine",
        "--capture-dir", str(captures), "--grpc-port", str(grpc_port),
    ) as server:  # fmt: skip
        if protocol == "http":
            ids = _send_http(server.url, xs)
        else:
            ids = _send_grpc(f"127.0.0.1:{grpc_port}", xs)
        assert len(set(ids)) == REQUESTS and all(ids)
        # Feedback reaches the engine, which holds the predictions.
        label = {"id": ids[0], "label": 0}
        r = httpx.post(f"{server.url}/v2/models/all/feedback", json=label, timeout=30)
        assert r.status_code == 200, r.text
    # Stopped: the engine stored its last captures on the way out.
    rows = {row.id: row for row in load_capture(captures, model="all")}
    assert rows.keys() == set(ids)
    for request_id, x in zip(ids, xs, strict=True):
        np.testing.assert_array_equal(rows[request_id].inputs["x"], x)
        np.testing.assert_array_equal(rows[request_id].outputs["y"], x)  # version 1: c = +1
