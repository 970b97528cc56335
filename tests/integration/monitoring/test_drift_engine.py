"""Drift monitoring with `--workers 2 --engine`: the engine runs every batcher, so one
monitor per version sees every request, whichever front end took it; the drift report and
the admin endpoint reach it through either front end, over HTTP and gRPC."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from inferd.monitoring.reference import npz_bytes
from tests.support.drift_models import SHIFTED, live_rows, reference_rows, write_drift_model
from tests.support.metrics_scrape import scrape_url, value
from tests.support.servers import CliServer, free_port, run_cli_server

WATCHED = {"drift_window": "200", "drift_cpu_budget": "1"}
DEADLINE_S = 60


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CliServer, int, int]]:
    root = tmp_path_factory.mktemp("drift_engine")
    write_drift_model(root / "models", "watched", WATCHED)
    grpc_port, metrics_port = free_port(), free_port()
    with run_cli_server(
        root / "models", root / "server.log", "--workers", "2", "--engine",
        "--model-control-mode", "explicit", "--load-model", "watched",
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
    ) as cli:  # fmt: skip
        yield cli, grpc_port, metrics_port


def infer(url: str, rows: np.ndarray) -> None:
    doc = {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": list(rows.shape),
             "data": rows.ravel().tolist()}
        ]
    }  # fmt: skip
    # A new connection each time: the kernel may hand it to either front end.
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/v2/models/watched/infer", json=doc)
    assert r.status_code == 200, r.text


def drift_when(url: str, rows: int) -> dict[str, Any]:
    """The drift report once the engine's monitor has taken `rows` rows (its own state)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        doc: dict[str, Any] = httpx.get(f"{url}/v2/models/watched/drift", timeout=10).json()
        if doc["rows_seen"] >= rows and doc["samples"] == doc["rows_seen"] // 20:
            return doc
        assert time.monotonic() < deadline, f"the monitor never saw {rows} rows: {doc}"
        time.sleep(0.05)


def test_one_monitor_in_the_engine_sees_every_front_ends_requests(
    engine: tuple[CliServer, int, int],
) -> None:
    cli, grpc_port, metrics_port = engine
    rng = np.random.default_rng(21)
    for _ in range(20):
        infer(cli.url, live_rows(rng, 20))
    calm = drift_when(cli.url, 400)
    assert calm["rows_seen"] == 400 and calm["samples_dropped"] == 0
    assert not calm["drifting"]
    for _ in range(20):
        infer(cli.url, live_rows(rng, 20, shift=0.5))
    doc = drift_when(cli.url, 800)
    (entry,) = doc["tensors"]
    assert doc["drifting"] and int(entry["tests"]["ks"]["worst_column"]) in SHIFTED
    samples = scrape_url(f"http://127.0.0.1:{metrics_port}/metrics")
    labels = {"model": "watched", "version": "1", "tensor": "input", "test": "ks"}
    assert value(samples, "inferd_drift_alerting", **labels) == 1

    # Over gRPC through a front end's proxy, the same report.
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        call = channel.unary_unary("/inferd.admin.v1.Admin/GetDrift")
        over_grpc = json.loads(call(json.dumps({"model": "watched"}).encode()))
    assert over_grpc["rows_seen"] == 800 and over_grpc["drifting"]

    # A reference set through one front end holds for every front end's requests.
    shifted = reference_rows(2000, seed=4)
    shifted[:, SHIFTED] += 0.5
    r = httpx.post(
        f"{cli.url}/v2/models/watched/drift/reference",
        content=npz_bytes({"input": shifted}),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["reference"] == {"source": "admin"}, r.text
    for _ in range(20):
        infer(cli.url, live_rows(rng, 20, shift=0.5))
    assert not drift_when(cli.url, 1200)["drifting"]
