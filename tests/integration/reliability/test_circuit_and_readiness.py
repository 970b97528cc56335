"""Circuit breaker with fallback, readiness that tells the truth, and graceful shutdown.

The circuit and readiness cases run over HTTP and gRPC from one table of outcomes.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.admission_models import body
from tests.support.async_infer import FAILED, OK, PROTOCOLS, UNAVAILABLE
from tests.support.fault_models import CONSTANT_PY, RECORDING_PY, SWITCHABLE_PY, param, write_model
from tests.support.metrics_scrape import scrape, scrape_url, value
from tests.support.servers import RunningServer, free_port, run_cli_server, run_server


@pytest.fixture(scope="module")
def flag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flags") / "primary-fails"


# One model of each kind per protocol (`primary_http`, `primary_grpc`...): a circuit's state
# outlives a case (open_s), so the cases over one protocol never see the other's.


def _models(repo: Path, flag: Path, protocol: str) -> None:
    # open_s is what a test may take between the third failure and its check that the
    # circuit is open (a probe after it reaches the primary again): ample for a slow machine.
    breaker = param("circuit_breaker_failures", 3)
    write_model(
        repo,
        f"primary_{protocol}",
        SWITCHABLE_PY,
        param("flag_path", flag)
        + breaker
        + param("circuit_breaker_open_s", 2)
        + param("fallback_model", "backup"),
    )
    write_model(
        repo,
        f"lonely_{protocol}",
        SWITCHABLE_PY,
        param("flag_path", flag) + breaker + param("circuit_breaker_open_s", 30),
    )
    write_model(
        repo,
        f"flaky_{protocol}",
        SWITCHABLE_PY,
        param("flag_path", flag) + param("unready_after_failures", 4),
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, flag: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("circuit")
    for protocol in PROTOCOLS:
        _models(repo, flag, protocol)
    write_model(repo, "backup", CONSTANT_PY)
    with run_server(repo) as running:
        yield running


@dataclass
class Reply:
    status: str  # the HTTP status ("200") or the gRPC code's name ("OK")
    model_name: str = ""
    fallback_from: str = ""
    data: list[float] = field(default_factory=list)
    message: str = ""


class Client:
    """The calls these cases make, over HTTP (JSON) or gRPC (tritonclient.grpc)."""

    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.http = server.client() if protocol == "http" else None
        self.grpc = (
            grpcclient.InferenceServerClient(server.grpc_address) if protocol == "grpc" else None
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.http is not None:
            self.http.close()
        if self.grpc is not None:
            self.grpc.close()

    def infer(self, model: str, value: float) -> Reply:
        if self.http is not None:
            r = self.http.post(f"/v2/models/{model}/infer", json=body(value))
            if r.status_code != 200:
                return Reply(str(r.status_code), message=r.json()["error"])
            doc = r.json()
            return Reply(
                "200",
                doc["model_name"],
                doc.get("parameters", {}).get("fallback_from", ""),
                doc["outputs"][0]["data"],
            )
        assert self.grpc is not None
        inp = grpcclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
        try:
            result = self.grpc.infer(model, [inp])
        except InferenceServerException as exc:
            return Reply(str(exc.status()).removeprefix("StatusCode."), message=exc.message())
        response = result.get_response()
        fallback = response.parameters.get("fallback_from")
        return Reply(
            "OK",
            response.model_name,
            fallback.string_param if fallback is not None else "",
            result.as_numpy("OUT").ravel().tolist(),
        )

    def model_ready(self, model: str) -> bool:
        if self.http is not None:
            return self.http.get(f"/v2/models/{model}/ready").status_code == 200
        assert self.grpc is not None
        return bool(self.grpc.is_model_ready(model))

    def server_ready(self) -> bool:
        if self.http is not None:
            return self.http.get("/v2/health/ready").status_code == 200
        assert self.grpc is not None
        return bool(self.grpc.is_server_ready())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fallback_serves_while_the_primary_fails_then_the_primary_recovers(
    server: RunningServer, flag: Path, protocol: str
) -> None:
    primary = f"primary_{protocol}"
    with Client(protocol, server) as c:
        served = c.infer(primary, 1)
        assert (served.status, served.model_name, served.data) == (OK[protocol], primary, [2.0])
        flag.touch()
        try:
            failures = [c.infer(primary, 1).status for _ in range(3)]
            assert failures == [FAILED[protocol]] * 3
            # Open: the fallback answers, and the primary says it is not ready.
            served = c.infer(primary, 1)
            assert (served.status, served.model_name) == (OK[protocol], "backup")
            assert served.fallback_from == primary
            assert served.data == [100.0]
            assert not c.model_ready(primary)
            assert not c.server_ready()
        finally:
            flag.unlink()  # the primary is fixed
        # After open_s a probe reaches it and closes the circuit.
        deadline = time.monotonic() + 30
        while True:
            served = c.infer(primary, 1)
            if served.model_name == primary:
                break
            assert time.monotonic() < deadline, "the circuit never closed again"
            time.sleep(0.1)
        assert served.data == [2.0]
        assert c.model_ready(primary)
    metrics = scrape(server)
    assert value(metrics, "inferd_circuit_opens_total", model=primary) == 1
    assert value(metrics, "inferd_circuit_open", model=primary) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_open_circuit_without_fallback_fails_fast_with_503(
    server: RunningServer, flag: Path, protocol: str
) -> None:
    lonely = f"lonely_{protocol}"
    flag.touch()
    try:
        with Client(protocol, server) as c:
            assert [c.infer(lonely, 1).status for _ in range(3)] == [FAILED[protocol]] * 3
            refused = c.infer(lonely, 1)
        assert refused.status == UNAVAILABLE[protocol]
        assert "circuit is open" in refused.message
    finally:
        flag.unlink()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_failing_every_execution_is_not_ready(
    server: RunningServer, flag: Path, protocol: str
) -> None:
    flaky = f"flaky_{protocol}"
    with Client(protocol, server) as c:
        assert c.model_ready(flaky)
        # It serves, then fails every input: the probe after the fourth failure re-runs an
        # input it served, which fails too (it answers zeros, its warm-up sample: a model
        # that has served nothing yet is probed with that, and would stay ready).
        assert c.infer(flaky, 1).status == OK[protocol]
        flag.touch()
        try:
            assert [c.infer(flaky, 1).status for _ in range(4)] == [FAILED[protocol]] * 4
            assert not c.model_ready(flaky)
        finally:
            flag.unlink()
        assert c.infer(flaky, 1).status == OK[protocol]
        assert c.model_ready(flaky)


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
