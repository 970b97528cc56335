"""Circuit breaker with fallback, readiness that tells the truth, and graceful shutdown."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fault_models import CONSTANT_PY, RECORDING_PY, SWITCHABLE_PY, param, write_model
from tests.integration.test_admission import body
from tests.integration.test_metrics import scrape, scrape_url, value
from tests.servers import RunningServer, free_port, run_cli_server, run_server


@pytest.fixture(scope="module")
def flag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flags") / "primary-fails"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, flag: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("circuit")
    # open_s is what a test may take between the third failure and its check that the
    # circuit is open (a probe after it reaches the primary again): ample for a slow machine.
    breaker = param("circuit_breaker_failures", 3)
    write_model(
        repo,
        "primary",
        SWITCHABLE_PY,
        param("flag_path", flag)
        + breaker
        + param("circuit_breaker_open_s", 2)
        + param("fallback_model", "backup"),
    )
    write_model(
        repo,
        "lonely",
        SWITCHABLE_PY,
        param("flag_path", flag) + breaker + param("circuit_breaker_open_s", 30),
    )
    write_model(repo, "backup", CONSTANT_PY)
    write_model(
        repo, "flaky", SWITCHABLE_PY, param("flag_path", flag) + param("unready_after_failures", 4)
    )
    with run_server(repo) as running:
        yield running


def test_fallback_serves_while_the_primary_fails_then_the_primary_recovers(
    server: RunningServer, flag: Path
) -> None:
    with server.client() as c:
        assert c.post("/v2/models/primary/infer", json=body(1)).json()["outputs"][0]["data"] == [
            2.0
        ]
        flag.touch()
        failures = [c.post("/v2/models/primary/infer", json=body(1)) for _ in range(3)]
        assert [r.status_code for r in failures] == [500, 500, 500]
        # Open: the fallback answers, and the primary says it is not ready.
        served = c.post("/v2/models/primary/infer", json=body(1)).json()
        assert served["model_name"] == "backup"
        assert served["parameters"]["fallback_from"] == "primary"
        assert served["outputs"][0]["data"] == [100.0]
        assert c.get("/v2/models/primary/ready").status_code == 503
        assert c.get("/v2/health/ready").status_code == 503
        # The primary is fixed; after open_s a probe reaches it and closes the circuit.
        flag.unlink()
        deadline = time.monotonic() + 30
        while True:
            doc = c.post("/v2/models/primary/infer", json=body(1)).json()
            if doc["model_name"] == "primary":
                break
            assert time.monotonic() < deadline, "the circuit never closed again"
            time.sleep(0.1)
        assert doc["outputs"][0]["data"] == [2.0]
        assert c.get("/v2/models/primary/ready").status_code == 200
    metrics = scrape(server)
    assert value(metrics, "inferd_circuit_opens_total", model="primary") == 1
    assert value(metrics, "inferd_circuit_open", model="primary") == 0


def test_open_circuit_without_fallback_fails_fast_with_503(
    server: RunningServer, flag: Path
) -> None:
    flag.touch()
    try:
        with server.client() as c:
            for _ in range(3):
                assert c.post("/v2/models/lonely/infer", json=body(1)).status_code == 500
            r = c.post("/v2/models/lonely/infer", json=body(1))
        assert r.status_code == 503
        assert "circuit is open" in r.json()["error"]
        # A bad request is the client's fault: it never counts towards opening a circuit.
    finally:
        flag.unlink()


def test_a_model_failing_every_execution_is_not_ready(server: RunningServer, flag: Path) -> None:
    with server.client() as c:
        assert c.get("/v2/models/flaky/ready").status_code == 200
        flag.touch()
        try:
            for _ in range(4):
                assert c.post("/v2/models/flaky/infer", json=body(1)).status_code == 500
            assert c.get("/v2/models/flaky/ready").status_code == 503
        finally:
            flag.unlink()
        assert c.post("/v2/models/flaky/infer", json=body(1)).status_code == 200
        assert c.get("/v2/models/flaky/ready").status_code == 200


def test_sigterm_answers_every_request_in_flight(tmp_path: Path) -> None:
    write_model(tmp_path, "slow", RECORDING_PY, param("delay_ms", 500), max_batch_size=1)
    metrics_port = free_port()
    args = ("--grpc-port", "0", "--metrics-port", str(metrics_port), "--exit-timeout-secs", "20")
    with run_cli_server(tmp_path, tmp_path / "server.log", *args) as server:
        url = server.url
        proc = server.proc
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        statuses, ready_after_signal = asyncio.run(_sigterm_scenario(url, metrics_url, proc))
        returncode = proc.wait(timeout=60)  # SIGTERM was sent: wait, do not signal again
        output = server.output()
    assert statuses == [200, 200, 200, 200], output
    assert ready_after_signal in (0, 503)
    assert returncode == 0, output
    assert "shutdown complete" in output


async def _sigterm_scenario(
    url: str, metrics_url: str, proc: subprocess.Popen[bytes]
) -> tuple[list[int], int]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        probe = httpx.AsyncClient(base_url=url, timeout=10)
        await probe.get("/v2/health/live")  # a kept-alive connection, open before SIGTERM
        tasks = [
            asyncio.create_task(client.post("/v2/models/slow/infer", json=body(i + 1)))
            for i in range(4)
        ]
        # SIGTERM once the server has taken all four (queued, executing or answered): a
        # request still on its way when the signal lands is not "in flight".
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(_accepted, metrics_url, "slow") < 4:
            assert time.monotonic() < deadline, "the server never took all four requests"
            await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        try:  # a load balancer's probe: answered 503, or refused outright
            ready = (await probe.get("/v2/health/ready")).status_code
        except httpx.TransportError:
            ready = 0
        await probe.aclose()
        return [r.status_code for r in await asyncio.gather(*tasks)], ready


def _accepted(metrics_url: str, model: str) -> float:
    """Requests of MODEL queued, executing or answered, from the server's metrics."""
    samples = scrape_url(metrics_url)
    return sum(
        v
        for (name, labels), v in samples.items()
        if name in ("inferd_inflight_requests", "inferd_request_duration_seconds_count")
        and ("model", model) in labels
    )
