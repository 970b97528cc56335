"""`inferd serve --workers 2 --engine`: two front ends sharing the ports, one engine.

Every test runs the real command. Requests go over both protocols through the shared case
table (tests/support/async_infer.py); a sequence's requests arrive on new connections (the kernel
spreads them over the front ends) and still accumulate in the one engine; statistics are
exact without summing anything; explicit control mode and the repository API work; killing
a front end or the engine under load loses nothing that was accepted.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from tests.support.async_infer import OK, PROTOCOLS, UNAVAILABLE, AsyncInfer
from tests.support.bls_models import CALLER_CONFIG, DOUBLE_PY, RELAY_PY
from tests.support.ensemble_models import chain, write_ensemble
from tests.support.fault_models import RECORDING_PY, param, write_model
from tests.support.lifecycle_models import write_plus_model
from tests.support.metrics_scrape import scrape_url, value
from tests.support.models import EXAMPLES, builders
from tests.support.sequence_models import ACC_ONNX_CONFIG, accumulator_onnx
from tests.support.servers import CliServer, free_port, run_cli_server
from tests.support.stream_clients import GrpcStream, sse_events, wait_for_file
from tests.support.stream_models import write_stream_models

START_S = 60


@dataclass
class Engine:
    cli: CliServer
    grpc_port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return self.cli.url

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    root: Path

    def pid(self, child: str) -> int:
        """The live pid of child "0", "1" (front ends) or "2" (the engine), from the log."""
        found = re.findall(rf"worker {child} started \(pid (\d+)\)", self.cli.output())
        assert found, self.cli.output()
        return int(found[-1])


def _write_repo(root: Path) -> Path:
    models = root / "models"
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]),
        models / "identity" / "1" / "model.onnx",
    )
    # `IN` [1, 1] -> `OUT`: what the case table sends; `spare` is loaded by a test.
    echo = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])],
        "echo",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 1])],
    )
    builders._save(builders._ir(echo), models / "echo" / "1" / "model.onnx")
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]), models / "spare" / "1" / "model.onnx"
    )
    write_plus_model(models, "split", [1, 2], extra="version_policy: { all { } }")
    # One instance, executing one request at a time while root/gate exists, recording the
    # values it executed: the order the one batcher chose across front ends.
    extra = param("record_path", root / "executed") + param("gate_path", root / "gate")
    extra += "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"
    write_model(models, "prioritised", RECORDING_PY, extra)
    # Streams that say when they saw their client leave (a marker file per tag).
    (root / "markers").mkdir()
    write_stream_models(models, root / "markers")
    # A decoupled model (examples/models/word_stream: one response per word).
    shutil.copytree(EXAMPLES / "models" / "word_stream", models / "word_stream")
    (models / "acc_onnx").mkdir()
    (models / "acc_onnx" / "config.pbtxt").write_text(ACC_ONNX_CONFIG)
    builders._save(accumulator_onnx(), models / "acc_onnx" / "1" / "model.onnx")
    # Pipelines, which run in the engine: `twice`, an ensemble of double -> double, and
    # `relay`, a Python model calling double with BLS (OUT = 2 * IN + 1).
    write_model(models, "double", DOUBLE_PY, max_batch_size=8)
    write_ensemble(models, "twice", chain("twice", ["double", "double"]))
    write_model(models, "relay", RELAY_PY)
    relay_config = models / "relay" / "config.pbtxt"
    relay_config.write_text(CALLER_CONFIG.format(name="relay", extra=""))
    return models


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    root = tmp_path_factory.mktemp("engine")
    models = _write_repo(root)
    grpc_port, metrics_port = free_port(), free_port()
    with run_cli_server(
        models, root / "server.log", "--workers", "2", "--engine",
        "--model-control-mode", "explicit", "--load-model", "identity",
        "--load-model", "acc_onnx", "--load-model", "echo", "--load-model", "word_stream",
        "--load-model", "split", "--load-model", "prioritised", "--load-model", "repeat_inferd",
        "--load-model", "double", "--load-model", "twice", "--load-model", "relay",
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
    ) as cli:  # fmt: skip
        yield Engine(cli, grpc_port, metrics_port, root)


def _infer(
    url: str, model: str, values: list[float], name: str = "INPUT0", **params: Any
) -> httpx.Response:
    doc: dict[str, Any] = {
        "inputs": [{"name": name, "datatype": "FP32", "shape": [1, len(values)], "data": values}]
    }
    if params:
        doc["parameters"] = params
    # A new connection each time: the kernel may hand it to either front end.
    with httpx.Client(base_url=url, timeout=10) as client:
        return client.post(f"/v2/models/{model}/infer", json=doc)


def _inference_count(url: str, model: str) -> int:
    doc = httpx.get(f"{url}/v2/models/{model}/stats", timeout=10).json()
    return int(doc["model_stats"][0]["inference_count"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_on_every_front_end_and_statistics_exact(engine: Engine, protocol: str) -> None:
    before = _inference_count(engine.url, "echo")

    async def scenario() -> list[Any]:
        # Eight clients, eight connections (gRPC: channels): both front ends take some.
        clients = [AsyncInfer(protocol, engine, connections=1) for _ in range(8)]
        try:
            return await asyncio.gather(*(c("echo", float(i)) for i, c in enumerate(clients)))
        finally:
            for c in clients:
                await c.__aexit__(None, None, None)

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [OK[protocol]] * 8
    assert [r.data for r in replies] == [[float(i)] for i in range(8)]
    # The engine's own count: no sibling to sum, nothing missed or counted twice.
    assert _inference_count(engine.url, "echo") == before + 8
    samples = scrape_url(f"http://127.0.0.1:{engine.metrics_port}/metrics")
    assert value(samples, "inferd_request_success_total", model="echo", version="1") >= 8
    # One endpoint, the front ends' series beside the engine's.
    assert value(samples, "inferd_front_ends_connected") == 2
    taken = [value(samples, "inferd_front_end_requests_total", front_end=i) for i in "01"]
    assert sum(taken) >= 8


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_and_a_bls_call_answer_through_the_front_ends(
    engine: Engine, protocol: str
) -> None:
    before = _inference_count(engine.url, "double")

    async def scenario() -> list[Any]:
        # Four clients, four connections: both front ends take some; all run in the engine.
        clients = [AsyncInfer(protocol, engine, connections=1) for _ in range(4)]
        try:
            asked = [c("twice" if i % 2 else "relay", float(i)) for i, c in enumerate(clients)]
            return await asyncio.gather(*asked)
        finally:
            for c in clients:
                await c.__aexit__(None, None, None)

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [OK[protocol]] * 4
    assert [r.data for r in replies] == [[1.0], [4.0], [5.0], [12.0]]  # 2x + 1 | 4x
    # Each ensemble request is two calls of `double`, each BLS call one, counted in the engine.
    assert _inference_count(engine.url, "double") == before + 2 * 2 + 2


def test_an_error_in_the_engine_reads_as_in_one_process(engine: Engine) -> None:
    r = _infer(engine.url, "nope", [1.0])
    assert (r.status_code, r.json()) == (404, {"error": "unknown model 'nope'"})
    r = _infer(engine.url, "identity", [])  # shape [1, 0] is fine; a wrong dtype is not
    assert r.status_code == 200
    bad = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}
    r = httpx.post(f"{engine.url}/v2/models/identity/infer", json=bad, timeout=10)
    assert r.status_code == 400 and "INPUT0" in r.json()["error"]


def test_a_sequence_spread_over_front_ends_accumulates_in_the_engine(engine: Engine) -> None:
    sums = []
    for i, x in enumerate([1.0, 2.0, 3.0, 4.0]):
        r = _infer(engine.url, "acc_onnx", [x], "IN", sequence_id=4242, sequence_start=i == 0)
        assert r.status_code == 200, r.text
        sums.append(r.json()["outputs"][0]["data"][0])
    assert sums == [1.0, 3.0, 6.0, 10.0]


def test_streams_of_a_decoupled_model_over_both_protocols(engine: Engine) -> None:
    with httpx.stream(
        "POST",
        f"{engine.url}/v2/models/word_stream/generate_stream",
        json={"text_input": "one two three"},
        timeout=30,
    ) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200
    assert [e.split('"text_output":"')[1].split('"')[0] for e in events] == ["one", "two", "three"]

    client = grpcclient.InferenceServerClient(engine.grpc_address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"alpha beta"], dtype=object))
        client.async_stream_infer("word_stream", [text], request_id="s1")
        words = []
        for _ in range(2):
            result, error = answers.get(timeout=30)
            assert error is None, error
            words.append(result.as_numpy("text_output").tolist())
    finally:
        client.stop_stream()
        client.close()
    assert words == [[b"alpha"], [b"beta"]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_system_shared_memory_is_the_engines(engine: Engine, protocol: str) -> None:
    """A region registered through one front end serves requests on any: the engine holds
    the table and reads and writes the regions."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    module: Any = httpclient if protocol == "http" else grpcclient
    address = engine.url.removeprefix("http://") if protocol == "http" else engine.grpc_address
    key = f"inferd-engine-{protocol}-{os.getpid()}"  # region names; their keys: /name
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    regions = {}
    for name in ("in", "out"):
        regions[name] = shm.create_shared_memory_region(f"{key}-{name}", f"/{key}-{name}", 16)
    shm.set_shared_memory_region(regions["in"], [x])
    try:
        # A new client per call: its connection may land on either front end.
        for name in ("in", "out"):
            module.InferenceServerClient(address).register_system_shared_memory(
                f"{key}-{name}", f"/{key}-{name}", 16
            )
        for _ in range(3):
            inp = module.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_shared_memory(f"{key}-in", 16)
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"{key}-out", 16)
            module.InferenceServerClient(address).infer("identity", [inp], outputs=[out])
            answer = shm.get_contents_as_numpy(regions["out"], np.float32, [1, 4])
            np.testing.assert_array_equal(answer, x)
    finally:
        module.InferenceServerClient(address).unregister_system_shared_memory()
        for handle in regions.values():
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_that_leaves_a_stream_cancels_it_in_the_engine(
    engine: Engine, protocol: str
) -> None:
    tag = 300 + PROTOCOLS.index(protocol)
    if protocol == "grpc":
        stream = GrpcStream(engine)
        stream.send("repeat_inferd", "leaving", N=-1, TAG=tag)  # N=-1: until cancelled
        result, error = stream.next()
        assert error is None and int(result.as_numpy("OUT")[0]) == tag * 1000
        stream.close(cancel=True)
    else:
        with (
            httpx.Client(base_url=engine.url, timeout=30) as client,
            client.stream(
                "POST", "/v2/models/repeat_inferd/generate_stream", json={"N": -1, "TAG": tag}
            ) as r,
        ):
            assert next(sse_events(r.iter_lines()))["OUT"] == tag * 1000
        # Leaving the block closed the connection (to the front end) mid-stream.
    # The model, in the engine, sees is_cancelled() turn true.
    wait_for_file(engine.root / "markers" / f"cancelled-{tag}")


def test_explicit_mode_and_the_repository_api_work(engine: Engine) -> None:
    with httpx.Client(base_url=engine.url, timeout=30) as client:
        assert client.get("/v2/models/spare/ready").status_code != 200
        assert client.post("/v2/repository/models/spare/load").status_code == 200
        # Loaded once, in the engine: every front end serves it at once.
        for _ in range(4):
            assert _infer(engine.url, "spare", [5.0]).status_code == 200
        assert client.post("/v2/repository/models/spare/unload").status_code == 200
        assert _infer(engine.url, "spare", [5.0]).status_code in (404, 503)


def test_canary_routing_promote_and_rollback_reach_every_front_end(engine: Engine) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}

    def versions_served() -> set[str]:
        served = set()
        for _ in range(12):  # new connections: both front ends take some
            with httpx.Client(base_url=engine.url, timeout=10) as c:
                served.add(c.post("/v2/models/split/infer", json=body).json()["model_version"])
        return served

    with httpx.Client(base_url=engine.url, timeout=10) as c:
        c.post("/v2/models/split/routing", json={"weights": {"2": 10, "1": 90}})
        promoted = c.post("/v2/models/split/routing/promote", json={"version": "2"}).json()
        assert promoted["weights"] == {"2": 100}
        assert versions_served() == {"2"}
        undone = c.post("/v2/models/split/routing/rollback", json={}).json()
        assert undone["weights"] == {"2": 10, "1": 90}
        rolled = c.post("/v2/models/split/routing/rollback", json={}).json()
        assert rolled["weights"] == {"2": 0, "1": 90}
        assert versions_served() == {"1"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_priorities_hold_across_front_ends(engine: Engine, protocol: str) -> None:
    """Requests on different connections (so on both front ends) wait in the one batcher,
    which runs the higher priority first, whichever front end it came through."""
    gate, record = engine.root / "gate", engine.root / "executed"
    before = len(record.read_text().split()) if record.exists() else 0

    def queued() -> float:
        samples = scrape_url(f"http://127.0.0.1:{engine.metrics_port}/metrics")
        return value(samples, "inferd_queue_depth", model="prioritised", version="1")

    def inflight() -> float:
        samples = scrape_url(f"http://127.0.0.1:{engine.metrics_port}/metrics")
        return value(samples, "inferd_inflight_requests", model="prioritised", version="1")

    async def scenario() -> list[str]:
        clients = [AsyncInfer(protocol, engine, connections=1) for _ in range(5)]
        try:
            sent = [asyncio.create_task(clients[0]("prioritised", 41))]  # holds the instance
            await _until_async(lambda: inflight() == 1)
            for i, (v, priority) in enumerate([(42, 2), (43, 2), (44, 1), (45, 1)], 1):
                sent.append(asyncio.create_task(clients[i]("prioritised", v, priority)))
                await _until_async(lambda i=i: queued() == i)  # type: ignore[misc]
            gate.unlink()
            return [r.status for r in await asyncio.gather(*sent)]
        finally:
            gate.unlink(missing_ok=True)
            for c in clients:
                await c.__aexit__(None, None, None)

    gate.touch()
    assert asyncio.run(scenario()) == [OK[protocol]] * 5
    assert [int(v) for v in record.read_text().split()][before:] == [41, 44, 45, 42, 43]


async def _until_async(condition: Any) -> None:
    deadline = time.monotonic() + START_S
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_killed_front_end_loses_only_its_connections(engine: Engine) -> None:
    victim = engine.pid("0")
    outcomes = _under_load(engine, lambda: os.kill(victim, signal.SIGKILL))
    # Its siblings kept answering; what was lost was on the dead one's connections.
    assert outcomes["200"] > 0 and outcomes["503"] == 0, outcomes
    _wait_until(lambda: engine.pid("0") != victim, "front end 0 restarted")
    _wait_until(lambda: _ready(engine.url), "ready again")
    assert _infer(engine.url, "identity", [1.0]).status_code == 200


def test_a_killed_engine_answers_503_at_once_then_comes_back(engine: Engine) -> None:
    victim = engine.pid("2")
    outcomes = _under_load(engine, lambda: os.kill(victim, signal.SIGKILL))
    # The front ends lived: every request got one answer, 503 while no engine was there
    # (requests in the engine when it died included), none hung or was dropped.
    assert outcomes["lost"] == 0 and outcomes["503"] > 0, outcomes
    assert outcomes["200"] + outcomes["503"] == 8 * 20

    async def grpc_while_away() -> str:
        async with AsyncInfer("grpc", engine) as g:
            return (await g("echo", 1.0)).status

    status = asyncio.run(grpc_while_away())
    assert status in (UNAVAILABLE["grpc"], OK["grpc"])  # OK: the new engine was quick
    _wait_until(lambda: _ready(engine.url), "ready once the engine is back")
    # It reloaded what the command line loads (explicit mode: --load-model).
    assert _infer(engine.url, "identity", [2.0]).json()["outputs"][0]["data"] == [2.0]
    samples = scrape_url(f"http://127.0.0.1:{engine.metrics_port}/metrics")
    lost = [value(samples, "inferd_front_end_engine_lost_total", front_end=i) for i in "01"]
    assert min(lost) >= 1  # more if one reconnected to the dying engine's socket


def _under_load(engine: Engine, kill: Any) -> Counter[str]:
    """20 rounds of 8 requests at once (8 connections), `kill` before the sixth: how each
    ended (its HTTP status, or "lost" with its connection). None may hang: a hang fails the
    client's timeout and the test."""

    async def scenario() -> Counter[str]:
        outcomes: Counter[str] = Counter()
        async with httpx.AsyncClient(base_url=engine.url, timeout=10) as client:

            async def one(i: int) -> str:
                doc = {
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [i]}]
                }
                try:
                    r = await client.post("/v2/models/identity/infer", json=doc)
                except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
                    return "lost"
                return str(r.status_code)

            for round_ in range(20):
                if round_ == 5:
                    kill()
                outcomes.update(await asyncio.gather(*(one(i) for i in range(8))))
        return outcomes

    return asyncio.run(scenario())


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + START_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.05)


def test_sigterm_answers_what_is_in_flight_then_stops_front_ends_then_the_engine(
    tmp_path: Path,
) -> None:
    models, gate = tmp_path / "models", tmp_path / "gate"
    write_model(models, "gated", RECORDING_PY, param("gate_path", gate))
    gate.touch()  # closed: requests wait in the model until the test opens it
    metrics_port = free_port()
    with run_cli_server(
        models, tmp_path / "server.log", "--workers", "2", "--engine",
        "--metrics-port", str(metrics_port),
    ) as cli:  # fmt: skip

        def send(i: int) -> int:
            doc = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [i]}]}
            return httpx.post(f"{cli.url}/v2/models/gated/infer", json=doc, timeout=60).status_code

        def in_the_engine() -> float:
            samples = scrape_url(f"http://127.0.0.1:{metrics_port}/metrics")
            return sum(value(samples, "inferd_front_end_inflight", front_end=i) for i in "01")

        with ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(send, i + 1) for i in range(8)]
            _wait_until(lambda: in_the_engine() == 8, "8 requests in flight in the engine")
            cli.proc.send_signal(signal.SIGTERM)
            _wait_until(lambda: "stopping" in cli.output(), "the supervisor took the signal")
            gate.unlink()  # the model may finish now: every request in flight is answered
            assert [a.result() for a in answers] == [200] * 8
        assert cli.proc.wait(timeout=60) == 0
        out = cli.output()
    # Front ends first (their open requests finish in the engine), then the engine.
    stopped = re.findall(r"all workers stopped \(exit codes (\[[^\]]*\])\)", out)
    assert stopped == ["[0, 0]", "[0]"], out


def test_the_engine_writes_the_trace_file_with_the_front_ends_arrival_times(
    tmp_path: Path,
) -> None:
    """A request arrives at a front end (REQUEST_START, its clock) and runs in the engine (the
    rest): one machine-wide monotonic clock, so the timestamps of each trace stay in order."""
    models = tmp_path / "models"
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]),
        models / "identity" / "1" / "model.onnx",
    )
    trace = tmp_path / "trace.json"
    grpc_port = free_port()
    with run_cli_server(
        models, tmp_path / "server.log", "--workers", "2", "--engine",
        "--grpc-port", str(grpc_port), "--metrics-port", str(free_port()),
        "--trace-config", f"triton,file={trace}", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1",
    ) as cli:  # fmt: skip
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        for _ in range(2):
            assert httpx.post(f"{cli.url}/v2/models/identity/infer", json=doc).status_code == 200
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
            inp.set_data_from_numpy(np.ones((1, 2), np.float32))
            for _ in range(2):
                client.infer("identity", [inp])
        cli.proc.send_signal(signal.SIGTERM)
        assert cli.proc.wait(timeout=60) == 0
    traces = json.loads(trace.read_text())
    assert [t["id"] for t in traces] == [1, 2, 3, 4]
    for t in traces:
        assert t["model_name"] == "identity"
        assert len(t["timestamps"]) == 7
        ns = [s["ns"] for s in t["timestamps"]]
        assert ns == sorted(ns), t
