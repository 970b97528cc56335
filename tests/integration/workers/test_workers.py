"""`inferd serve --workers N`: several processes on one set of ports, one server to clients.

Every test runs the real command: a supervisor, spawned workers sharing the HTTP and gRPC
ports through SO_REUSEPORT, statistics summed across workers, one metrics endpoint.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.support.metrics_scrape import scrape_url, value
from tests.support.models import builders
from tests.support.servers import CliServer, free_port, run_cli_server


def _metrics(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return scrape_url(f"http://127.0.0.1:{port}/metrics")


def _alive(port: int) -> float:
    return value(_metrics(port), "inferd_workers_alive")


def _body(values: list[float]) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}
        ]
    }


def _answered_per_worker(metrics_port: int) -> dict[str, float]:
    samples = _metrics(metrics_port)
    return {
        w: value(samples, "inferd_request_success_total", model="identity", version="1", worker=w)
        for w in ("0", "1")
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workers") / "models"
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]), root / "identity" / "1" / "model.onnx"
    )
    return root


@pytest.fixture(scope="module")
def two_workers(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CliServer, int, int]]:
    grpc_port, metrics_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("workers-log") / "server.log"
    with run_cli_server(
        repo, log_path, "--workers", "2", "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port), "--metrics-triton-names",
    ) as server:  # fmt: skip
        _wait_until_both_serve(server, metrics_port)
        yield server, grpc_port, metrics_port


def _wait_until_both_serve(server: CliServer, metrics_port: int) -> None:
    # Ready means one worker answers; wait until both count in the metrics (a worker reports
    # there only once it has loaded and installed its signal handlers).
    deadline = time.monotonic() + 60
    while _alive(metrics_port) != 2:
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.2)


def test_both_workers_answer_on_the_shared_port(two_workers: tuple[CliServer, int, int]) -> None:
    server, _, metrics_port = two_workers
    assert value(_metrics(metrics_port), "inferd_workers") == 2
    before = _answered_per_worker(metrics_port)
    for i in range(200):
        # A new connection each time: the kernel spreads connections, not requests.
        r = httpx.post(f"{server.url}/v2/models/identity/infer", json=_body([float(i)]))
        assert r.status_code == 200
        assert r.json()["outputs"][0]["data"] == [float(i)]
    after = _answered_per_worker(metrics_port)
    per_worker = {w: after[w] - before[w] for w in after}
    assert sum(per_worker.values()) == 200
    assert min(per_worker.values()) > 0, per_worker  # chance of a miss: 2 * 2**-200


def test_statistics_sum_every_worker(two_workers: tuple[CliServer, int, int]) -> None:
    server, _, _ = two_workers

    def count() -> int:
        # Whichever worker takes the statistics call sums its sibling's numbers in.
        doc = httpx.get(f"{server.url}/v2/models/identity/stats").json()
        return int(doc["model_stats"][0]["inference_stats"]["success"]["count"])

    before = count()
    for i in range(60):
        httpx.post(f"{server.url}/v2/models/identity/infer", json=_body([float(i)]))
    # Ask on many connections (landing on both workers): every answer has all 60.
    answers = {count() - before for _ in range(20)}
    assert answers == {60}


def test_grpc_shares_its_port_too(two_workers: tuple[CliServer, int, int]) -> None:
    _, grpc_port, metrics_port = two_workers
    before = _answered_per_worker(metrics_port)
    for i in range(60):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        data = np.full((1, 3), float(i), np.float32)
        inp = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), data)
        client.close()
    after = _answered_per_worker(metrics_port)
    assert sum(after.values()) - sum(before.values()) == 60
    assert all(after[w] > before[w] for w in after), (before, after)


def test_shared_memory_needs_one_process(two_workers: tuple[CliServer, int, int]) -> None:
    # Another worker would take the request that names a region registered with this one:
    # registration says so over both protocols, and neither offers the extension.
    server, grpc_port, _ = two_workers
    body = {"key": "/inferd-workers-test", "offset": 0, "byte_size": 64}
    r = httpx.post(f"{server.url}/v2/systemsharedmemory/region/w/register", json=body)
    assert r.status_code == 400 and "needs a server of one process" in r.json()["error"]
    meta = httpx.get(f"{server.url}/v2").json()
    assert "system_shared_memory" not in meta["extensions"] and "statistics" in meta["extensions"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        with pytest.raises(InferenceServerException, match="needs a server of one process"):
            client.register_system_shared_memory("w", "/inferd-workers-test", 64)
        assert "system_shared_memory" not in client.get_server_metadata().extensions
    finally:
        client.close()


def test_triton_names_per_worker_and_the_host_once(
    two_workers: tuple[CliServer, int, int],
) -> None:
    server, _, metrics_port = two_workers
    assert httpx.post(f"{server.url}/v2/models/identity/infer", json=_body([1.0])).is_success
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # Per-model counters: Triton's type, one series per worker.
    success = families["nv_inference_request_success"]
    assert success.type == "counter"
    assert {s.labels["worker"] for s in success.samples} == {"0", "1"}
    # The host's series come from the supervisor, once, with no worker label.
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        (sample,) = families[name].samples
        assert "worker" not in sample.labels, name


def test_a_killed_worker_is_restarted_and_the_others_keep_serving(
    two_workers: tuple[CliServer, int, int],
) -> None:
    server, _, metrics_port = two_workers
    victim = _worker_pids(server.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    # A connection the kernel queued on the victim's socket before it died is reset; what
    # this test is about starts once the victim has exited (its sockets closed with it).
    deadline = time.monotonic() + 30
    while not _exited(victim):
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.01)
    # Meanwhile every new connection is served (by the survivor, then by both).
    deadline = time.monotonic() + 60
    restarted = False
    while time.monotonic() < deadline:
        r = httpx.post(f"{server.url}/v2/models/identity/infer", json=_body([1.0]))
        assert r.status_code == 200
        samples = _metrics(metrics_port)
        restarts = sum(value(samples, "inferd_worker_restarts_total", worker=w) for w in ("0", "1"))
        if restarts == 1 and value(samples, "inferd_workers_alive") == 2:
            restarted = True
            break
        time.sleep(0.1)
    assert restarted, server.output()
    assert victim not in _worker_pids(server.proc.pid)
    # Said as what happened to it, not as multiprocessing's exit code (-9).
    assert re.search(
        rf"worker [01] \(pid {victim}\) killed by SIGKILL; restarting it", server.output()
    )
    assert "exited with -9" not in server.output()


def test_every_worker_line_names_its_worker(two_workers: tuple[CliServer, int, int]) -> None:
    """N processes write to one log: each worker's lines carry worker=<index>; the
    supervisor's own lines carry none."""
    server, _, _ = two_workers
    lines = server.output().splitlines()
    for index in (0, 1):
        loaded = [line for line in lines if "loaded model identity version 1" in line]
        assert any(line.endswith(f" worker={index}") for line in loaded), loaded
    supervisor = [line for line in lines if "inferd.workers:" in line]
    assert supervisor and not any("worker=" in line for line in supervisor), supervisor


def _exited(pid: int) -> bool:
    try:
        # Field 3 of /proc/PID/stat is the state; Z is a zombie not yet reaped.
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _worker_pids(supervisor: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(supervisor)], capture_output=True, text=True
    ).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line]


def test_sigterm_drains_every_worker_and_exits_0(repo: Path, tmp_path: Path) -> None:
    metrics_port = free_port()
    with run_cli_server(
        repo, tmp_path / "server.log", "--workers", "2", "--grpc-port", "0",
        "--metrics-port", str(metrics_port),
    ) as server:  # fmt: skip
        _wait_until_both_serve(server, metrics_port)
        workers = _worker_pids(server.proc.pid)
        assert len(workers) == 2
        assert server.stop() == 0
        output = server.output()
    assert "all workers stopped (exit codes [0, 0])" in output
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_refuse_what_would_reach_one_worker_only(repo: Path) -> None:
    for extra in (["--model-control-mode", "explicit"], ["--admin-api", "on"]):
        result = subprocess.run(
            [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
             "--workers", "2", *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "would reach one of them only" in result.stderr
        assert "--engine" in result.stderr  # the design that carries them
    result = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--workers", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--workers must be at least 1" in result.stderr


def test_workers_that_cannot_start_make_the_supervisor_give_up(repo: Path) -> None:
    # The port is held by a socket without SO_REUSEPORT: every worker's bind fails.
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
             "--workers", "2", "--http-port", str(port), "--grpc-port", "0",
             "--metrics-port", "0"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "every worker keeps dying at start; giving up" in result.stderr
    assert result.stderr.count("restarting it") >= 2 * 4  # each worker, before giving up
    assert time.monotonic() - started < 90


def test_poll_mode_swaps_a_new_version_in_every_worker(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model = builders.identity(TensorProto.FLOAT, ["batch", "n"])
    builders._save(model, repo / "identity" / "1" / "model.onnx")
    with run_cli_server(
        repo, tmp_path / "server.log", "--workers", "2", "--model-control-mode", "poll",
        "--repository-poll-secs", "0.3", "--grpc-port", "0", "--metrics-port", "0",
    ) as server:  # fmt: skip

        def served_versions() -> set[str]:
            # New connections land on either worker; ask often enough to hear from both.
            return {
                httpx.post(f"{server.url}/v2/models/identity/infer", json=_body([1.0])).json()[
                    "model_version"
                ]
                for _ in range(40)
            }

        assert served_versions() == {"1"}
        builders._save(model, repo / "identity" / "2" / "model.onnx")
        deadline = time.monotonic() + 30
        while served_versions() != {"2"}:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
