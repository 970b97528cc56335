"""The front ends of `--workers 2 --engine` check requests against the model's signature
before the hop (engine/model_table.py): a bad request gets the status and message one
process gives it, over HTTP and gRPC (tritonclient), and never reaches the engine (its
per-front-end request counter does not move); after a reload with another signature the
front ends check the new one; a canary whose signature differs is left to the engine. A
malformed request to a model that sheds gets the shed's 429, as in one process (admission
first), and a flood of malformed requests at a stopped engine leaves at most 64 notes per
front end unanswered, clients that leave included: the rest are answered at once and
counted as dropped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.fault_models import RECORDING_PY, param, write_model
from tests.support.metrics_scrape import scrape_url, value
from tests.support.models import builders
from tests.support.servers import CliServer, free_port, run_cli_server

PAIR_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
{policy}
input [
  {{ name: "A", data_type: TYPE_FP32, dims: [ 2 ] }},
  {{ name: "B", data_type: TYPE_FP32, dims: [ 2 ] }}
]
output [ {{ name: "SUM", data_type: TYPE_FP32, dims: [ 2 ] }} ]
"""


def _write_pair(models: Path, name: str, versions: list[int], max_batch: int = 4) -> None:
    """`A + B -> SUM`, each [batch, 2], batches of up to `max_batch`."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["SUM"])],
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in "AB"],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["batch", 2])],
    )
    for v in versions:
        builders._save(builders._ir(graph), models / name / str(v) / "model.onnx")
    policy = "version_policy: { all { } }" if len(versions) > 1 else ""
    config = PAIR_CONFIG.format(name=name, max_batch=max_batch, policy=policy)
    (models / name / "config.pbtxt").write_text(config)


@dataclass
class Served:
    url: str
    grpc_address: str
    metrics: str
    models: Path
    cli: CliServer

    @property
    def gate(self) -> Path:
        """While this file exists, `held` holds its (one) instance on each request."""
        return self.models.parent / "gate"

    def engine_pid(self) -> int:
        """The engine's pid (child 2 of `--workers 2 --engine`), from the log."""
        found = re.findall(r"worker 2 started \(pid (\d+)\)", self.cli.output())
        assert found, self.cli.output()
        return int(found[-1])

    def gauge(self, name: str, model: str) -> float:
        samples = scrape_url(self.metrics)
        return sum(
            v for (n, labels), v in samples.items() if n == name and ("model", model) in labels
        )

    def hop_requests(self, family: str = "inferd_front_end_requests_total") -> float:
        """Infer requests the front ends passed to the engine, all front ends together (or
        those they refused themselves: inferd_front_end_invalid_total)."""
        samples = scrape_url(self.metrics)
        return sum(value(samples, family, front_end=i) for i in "01")

    def failures(self, model: str) -> int:
        """The model's failed requests, by its statistics."""
        doc = httpx.get(f"{self.url}/v2/models/{model}/stats", timeout=10).json()
        return int(doc["model_stats"][0]["inference_stats"]["fail"]["count"])


def _serve(root: Path, *args: str) -> Iterator[Served]:
    models = root / "models"
    _write_pair(models, "pair", [1])
    _write_pair(models, "swap", [1])
    _write_pair(models, "canary", [1, 2])
    # One instance, held while root/gate exists, and a queue of one: full behind a held run.
    held = "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
    held += "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
    write_model(models, "held", RECORDING_PY, held + param("gate_path", root / "gate"))
    grpc_port, metrics_port = free_port(), free_port()
    with run_cli_server(
        models, root / "server.log", "--model-control-mode", "explicit",
        "--load-model", "pair", "--load-model", "swap", "--load-model", "canary",
        "--load-model", "held",
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port), *args,
    ) as cli:  # fmt: skip
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        yield Served(cli.url, f"127.0.0.1:{grpc_port}", metrics, models, cli)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("engine"), "--workers", "2", "--engine")


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("single"))


# name -> the inputs a bad request sends (name, datatype, shape) to `pair` (A, B: FP32 [b, 2]).
BAD = {
    "wrong shape": [("A", "FP32", [1, 3]), ("B", "FP32", [1, 2])],
    "wrong datatype": [("A", "INT32", [1, 2]), ("B", "FP32", [1, 2])],
    "unknown input": [("A", "FP32", [1, 2]), ("B", "FP32", [1, 2]), ("C", "FP32", [1, 2])],
    "missing input": [("A", "FP32", [1, 2])],
    "batch past max_batch_size": [("A", "FP32", [5, 2]), ("B", "FP32", [5, 2])],
    "batch sizes differ": [("A", "FP32", [1, 2]), ("B", "FP32", [2, 2])],
}
GOOD = [("A", "FP32", [1, 2]), ("B", "FP32", [1, 2])]
PROTOCOLS = ["http", "grpc"]


def _eventually(condition: Callable[[], bool], within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


def _infer(
    served: Served,
    protocol: str,
    model: str,
    inputs: list[tuple[str, str, list[int]]],
    version: str = "",
    routing_key: str = "",
) -> tuple[str, str]:
    """(status, error message or the version that answered), through tritonclient."""
    module: Any = httpclient if protocol == "http" else grpcclient
    address = served.url.removeprefix("http://") if protocol == "http" else served.grpc_address
    client = module.InferenceServerClient(address)
    tensors = []
    for name, datatype, shape in inputs:
        t = module.InferInput(name, shape, datatype)
        dtype = np.float32 if datatype == "FP32" else np.int32
        t.set_data_from_numpy(np.ones(shape, dtype))
        tensors.append(t)
    headers = {"inferd-routing-key": routing_key} if routing_key else None
    try:
        result = client.infer(model, tensors, model_version=version, headers=headers)
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode."), str(exc.message())
    finally:
        client.close()
    answer = result.get_response()
    return "OK", answer["model_version"] if protocol == "http" else answer.model_version


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_request_is_refused_by_the_front_end_as_by_one_process(
    engine: Served, single: Served, protocol: str, case: str
) -> None:
    failed = single.failures("pair")
    expected = _infer(single, protocol, "pair", BAD[case])
    assert expected[0] in ("400", "INVALID_ARGUMENT"), expected
    assert single.failures("pair") == failed + 1
    before, failed = engine.hop_requests(), engine.failures("pair")
    invalid = engine.hop_requests("inferd_front_end_invalid_total")
    for version in ("", "1"):  # by default route and by version: the table has both
        assert _infer(engine, protocol, "pair", BAD[case], version) == expected
    assert engine.hop_requests() == before  # refused before the hop: the engine never saw it
    # ... but counted as one process counts it: a failed request of the model (the front
    # end's note of it crosses the hop beside the answer: waited for, with a deadline).
    _eventually(lambda: engine.failures("pair") == failed + 2)
    assert engine.hop_requests("inferd_front_end_invalid_total") == invalid + 2
    assert _infer(engine, protocol, "pair", GOOD) == _infer(single, protocol, "pair", GOOD)
    assert engine.hop_requests() == before + 1


def test_after_a_reload_with_another_signature_the_front_ends_check_the_new_one(
    engine: Served,
) -> None:
    three = [("A", "FP32", [3, 2]), ("B", "FP32", [3, 2])]
    assert _infer(engine, "http", "swap", three) == ("OK", "1")
    # The repository API loads `swap` again with a config of batches of at most 2.
    client = httpclient.InferenceServerClient(engine.url.removeprefix("http://"))
    config = client.get_model_config("swap")
    client.load_model("swap", config=json.dumps({**config, "max_batch_size": 2}))
    client.close()
    before = engine.hop_requests()
    for protocol in PROTOCOLS:
        for _ in range(4):  # new connections: both front ends
            status, message = _infer(engine, protocol, "swap", three)
            assert status in ("400", "INVALID_ARGUMENT")
            assert message == (
                "input 'A': batch size 3 is outside 1..2 (max_batch_size of model 'swap')"
            )
    assert engine.hop_requests() == before
    two = [("A", "FP32", [2, 2]), ("B", "FP32", [2, 2])]
    assert _infer(engine, "grpc", "swap", two) == ("OK", "1")


def _key_to(version: str, weights: dict[str, int]) -> str:
    """A routing key that the router (routing.Router.pick: crc32 of the key, modulo the
    total weight, over the versions in order) sends to `version`."""
    ordered = sorted(weights.items(), key=lambda vw: int(vw[0]))
    low = sum(w for v, w in ordered[: [v for v, _ in ordered].index(version)])
    for i in range(1000):
        key = f"key-{i}"
        if low <= zlib.crc32(key.encode()) % sum(weights.values()) < low + weights[version]:
            return key
    raise AssertionError(f"no key routes to {version}")


def test_a_canary_whose_signature_differs_is_checked_by_the_engine(engine: Served) -> None:
    # Reloaded with batches of at most 2, version 1's file broken: version 2 loads with the
    # new signature, version 1 keeps serving with the old one (batches of up to 4).
    models = engine.models
    config = models / "canary" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 2"))
    (models / "canary" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    client = httpclient.InferenceServerClient(engine.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="still serving version 1, 2"):
        client.load_model("canary")
    client.close()
    weights = {"1": 50, "2": 50}
    with httpx.Client(base_url=engine.url, timeout=10) as c:
        assert c.post("/v2/models/canary/routing", json={"weights": weights}).status_code == 200
    three = [("A", "FP32", [3, 2]), ("B", "FP32", [3, 2])]
    refused = "input 'A': batch size 3 is outside 1..2 (max_batch_size of model 'canary')"
    to_1, to_2 = _key_to("1", weights), _key_to("2", weights)
    for protocol in PROTOCOLS:
        before = engine.hop_requests()
        # No version named: the front end cannot know whose signature applies; the engine
        # checks, each version by its own.
        assert _infer(engine, protocol, "canary", three, routing_key=to_1) == ("OK", "1")
        status, message = _infer(engine, protocol, "canary", three, routing_key=to_2)
        assert (status in ("400", "INVALID_ARGUMENT"), message) == (True, refused)
        assert engine.hop_requests() == before + 2
        # A version named: the front end checks it against that version's signature.
        assert _infer(engine, protocol, "canary", three, version="1") == ("OK", "1")
        status, message = _infer(engine, protocol, "canary", three, version="2")
        assert (status in ("400", "INVALID_ARGUMENT"), message) == (True, refused)
        assert engine.hop_requests() == before + 3


# -- malformed and shed: admission first, as in one process -----------------------------------


def _malformed(served: Served) -> list[tuple[str, str, str]]:
    """(case, status, message) of each malformed request to `held`: a body that is not JSON,
    a wrong shape (the signature), gRPC tensor data of the wrong size, a wrong shape over
    gRPC."""
    outcomes = []
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.post("/v2/models/held/infer", content=b'{"inputs": [', headers=_JSON)
        outcomes.append(("http body", str(r.status_code), r.json()["error"]))
        wrong = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
        r = c.post("/v2/models/held/infer", json=wrong)
        outcomes.append(("http shape", str(r.status_code), r.json()["error"]))
    channel = grpc.insecure_channel(served.grpc_address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    for case, shape, raw in (("grpc data", [1, 1], b"\0" * 3), ("grpc shape", [1, 3], b"\0" * 12)):
        request = pb.ModelInferRequest(model_name="held")
        request.inputs.add(name="IN", datatype="FP32", shape=shape)
        request.raw_input_contents.append(raw)
        try:
            stub.ModelInfer(request, timeout=30)
            outcomes.append((case, "OK", ""))
        except grpc.RpcError as exc:
            outcomes.append((case, exc.code().name, exc.details() or ""))
    channel.close()
    return outcomes


_JSON = {"content-type": "application/json"}


def _while_held_queue_is_full(served: Served) -> tuple[list[tuple[str, str, str]], list[int]]:
    """What `_malformed` answers while `held` runs one request and queues another (its queue
    of one is full), and the statuses of those two once released."""

    async def scenario() -> tuple[list[tuple[str, str, str]], list[int]]:
        served.gate.touch()
        try:
            async with httpx.AsyncClient(base_url=served.url, timeout=60) as c:

                def body(x: float) -> dict[str, Any]:
                    return {
                        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [x]}]
                    }

                async def until(depth: float, inflight: float) -> None:
                    deadline = time.monotonic() + 30
                    while (
                        await asyncio.to_thread(served.gauge, "inferd_queue_depth", "held"),
                        await asyncio.to_thread(served.gauge, "inferd_inflight_requests", "held"),
                    ) != (depth, inflight):
                        assert time.monotonic() < deadline, "held never reached its state"
                        await asyncio.sleep(0.01)

                running = asyncio.create_task(c.post("/v2/models/held/infer", json=body(1.0)))
                await until(0, 1)  # executing, held
                queued = asyncio.create_task(c.post("/v2/models/held/infer", json=body(2.0)))
                await until(1, 2)  # queued: the queue of one is full
                outcomes = await asyncio.to_thread(_malformed, served)
                served.gate.unlink()
                replies = [await running, await queued]
        finally:
            served.gate.unlink(missing_ok=True)
        return outcomes, [r.status_code for r in replies]

    return asyncio.run(scenario())


def test_a_malformed_request_to_a_model_that_sheds_gets_the_429_as_in_one_process(
    engine: Served, single: Served
) -> None:
    shed = "model 'held' queue is full; retry later"
    for served in (single, engine):
        outcomes, held = _while_held_queue_is_full(served)
        assert held == [200, 200]
        assert outcomes == [
            ("http body", "429", shed),
            ("http shape", "429", shed),
            ("grpc data", "RESOURCE_EXHAUSTED", shed),
            ("grpc shape", "RESOURCE_EXHAUSTED", shed),
        ], served
    # Not shedding: the same requests are malformed, 400, the same words on both servers.
    refused = _malformed(single)
    assert [o[1] for o in refused] == ["400", "400", "INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert _malformed(engine) == refused


# -- a flood of malformed requests at an engine that does not read -----------------------------

FLOOD = 400  # malformed requests
CONNECTIONS = 200  # at once: more than the notes both front ends may keep unanswered
MAX_UNANSWERED = 2 * 64  # engine_client.MAX_REFUSALS per front end
WRONG = {
    "inputs": [
        {"name": "A", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "B", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]},
    ]
}


async def _until_done(calls: list[asyncio.Task[httpx.Response]], count: int) -> None:
    deadline = time.monotonic() + 60
    while sum(t.done() for t in calls) < count:
        assert time.monotonic() < deadline, f"{sum(t.done() for t in calls)} of {count} answered"
        await asyncio.sleep(0.01)


def _flood(engine: Served, leave: bool) -> list[int]:
    """FLOOD malformed requests to `pair` over CONNECTIONS at once while the engine is stopped
    (it reads no note). Those past the bound are answered by the front ends at once. With
    `leave`, the clients still waiting then leave, and CONNECTIONS more are sent on new
    connections: a client that left frees no room, so those are answered at once too. The
    statuses of the requests answered."""

    def client() -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
        return httpx.AsyncClient(base_url=engine.url, timeout=120, limits=limits)

    async def scenario() -> list[int]:
        answered = []
        async with client() as c:
            pid = engine.engine_pid()
            os.kill(pid, signal.SIGSTOP)  # the engine reads nothing: notes can only wait
            try:
                path = "/v2/models/pair/infer"
                calls = [asyncio.create_task(c.post(path, json=WRONG)) for _ in range(FLOOD)]
                await _until_done(calls, FLOOD - MAX_UNANSWERED)
                if leave:
                    waiting = [t for t in calls if not t.done()]
                    for t in waiting:
                        t.cancel()
                    await asyncio.gather(*waiting, return_exceptions=True)
                    calls = [t for t in calls if not t.cancelled()]
                    async with client() as again:
                        more = [
                            asyncio.create_task(again.post(path, json=WRONG))
                            for _ in range(CONNECTIONS)
                        ]
                        await _until_done(more, CONNECTIONS)
                    answered += [t.result().status_code for t in more]
            finally:
                os.kill(pid, signal.SIGCONT)
            answered += [r.status_code for r in await asyncio.gather(*calls)]
        return answered

    return asyncio.run(scenario())


def _counts(engine: Served) -> tuple[int, int]:
    """Failed requests of `pair` (the notes the engine read), and requests the front ends
    answered alone (told to the engine once a note is answered)."""
    alone = engine.hop_requests("inferd_front_end_refusals_dropped_total")
    return engine.failures("pair"), int(alone)


def test_a_flood_of_malformed_requests_keeps_at_most_64_notes_unanswered_per_front_end(
    engine: Served,
) -> None:
    (failed, dropped), invalid = (
        _counts(engine),
        engine.hop_requests("inferd_front_end_invalid_total"),
    )
    assert _flood(engine, leave=False) == [400] * FLOOD

    def counted() -> tuple[int, int]:
        (noted, alone) = _counts(engine)
        return noted - failed, alone - dropped

    # Every request is counted once: by the engine, as a failure of `pair` (its note was
    # read), or by its front end as answered alone.
    _eventually(lambda: sum(counted()) == FLOOD, within_s=30)
    noted, alone = counted()
    assert noted <= MAX_UNANSWERED and alone >= FLOOD - MAX_UNANSWERED, (noted, alone)
    assert engine.hop_requests("inferd_front_end_invalid_total") - invalid == noted


def test_clients_that_leave_free_no_room_for_more_notes(engine: Served) -> None:
    failed, dropped = _counts(engine)
    answered = _flood(engine, leave=True)  # every request of the second wave answered at once
    assert set(answered) == {400} and len(answered) >= FLOOD - MAX_UNANSWERED + CONNECTIONS
    # Every answer came while the engine was stopped: from a front end alone, counted.
    _eventually(lambda: _counts(engine)[1] - dropped == len(answered), 30)
    # The notes of the clients that left are read (and counted) all the same: at most 128.
    assert 0 < _counts(engine)[0] - failed <= MAX_UNANSWERED
