"""Triton ensembles over HTTP and gRPC (tritonclient): results equal to the steps run one by
one, concurrent steps, errors naming the step with its status kept, deadlines and
cancellation across steps, batching of the steps under concurrent clients, statistics,
metrics and the request log per step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.async_infer import (
    BAD_REQUEST,
    DEADLINE,
    FAILED,
    OK,
    PROTOCOLS,
    SHED,
    AsyncInfer,
    Reply,
)
from tests.support.ensemble_models import calls, write_ensemble_models
from tests.support.metrics_scrape import scrape
from tests.support.servers import RunningServer, batcher_of, run_server, until, wait_for


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ensembles")
    write_ensemble_models(path)
    return path


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[RunningServer]:
    with run_server(root / "models", log_sample_rate=1.0) as running:
        yield running


@contextlib.contextmanager
def _client(protocol: str, server: RunningServer) -> Iterator[Any]:
    """tritonclient's client for `protocol`, closed after use."""
    client: Any = (
        httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_address)
    )
    try:
        yield client
    finally:
        client.close()


def _infer(protocol: str, server: RunningServer, model: str, x: np.ndarray) -> np.ndarray:
    module = httpclient if protocol == "http" else grpcclient
    inp = module.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with _client(protocol, server) as client:
        result = client.infer(model, [inp])
    out: np.ndarray = result.as_numpy("OUT")
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_chain_returns_what_its_steps_compute_one_by_one(
    server: RunningServer, protocol: str
) -> None:
    x = np.array([[1.0, -2.0, 3.5]], np.float32)
    by_hand = x
    for model in ("double", "add_ten", "square"):
        by_hand = _infer(protocol, server, model, by_hand)
    np.testing.assert_array_equal(_infer(protocol, server, "chain", x), by_hand)
    np.testing.assert_array_equal(by_hand, ((x * 2) + 10) ** 2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_independent_steps_join(server: RunningServer, protocol: str) -> None:
    x = np.array([[1.0, 4.0]], np.float32)
    np.testing.assert_array_equal(_infer(protocol, server, "diamond", x), x * 2 + (x + 10))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_step_starts_as_soon_as_its_inputs_exist(server: RunningServer, protocol: str) -> None:
    """`slow` finishes only once `after` ran, and `after` reads `fast`'s output: run in waves
    ({fast, slow} then {after}) `slow` gives up and the request fails; as dataflow it answers."""
    x = np.array([[1.5, -2.0]], np.float32)
    module = httpclient if protocol == "http" else grpcclient
    inp = module.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    wanted = [module.InferRequestedOutput(name) for name in ("OUT", "OUT2")]
    with _client(protocol, server) as client:
        result = client.infer(f"dataflow_{protocol}", [inp], outputs=wanted)
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 + 10)
    np.testing.assert_array_equal(result.as_numpy("OUT2"), x * x)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failing_step_is_named_and_keeps_its_status(server: RunningServer, protocol: str) -> None:
    async def go() -> tuple[str, str, str, str]:
        async with AsyncInfer(protocol, server) as infer:
            failed = await infer("failing", 6.5)  # doubled to 13, which `unlucky` refuses
            bad = await _bad_shape(protocol, server)
            return failed.status, failed.message, bad[0], bad[1]

    status, message, bad_status, bad_message = asyncio.run(go())
    branch = asyncio.run(_one(protocol, server, "diamond_fails", 13))
    assert branch.status == FAILED[protocol]  # a concurrent step's failure, not a group's
    assert branch.message.startswith("ensemble 'diamond_fails' step 2 (unlucky): ")
    assert status == FAILED[protocol]
    assert message.startswith("ensemble 'failing' step 2 (unlucky): ")
    assert "13 is unlucky" in message
    # A step's 400 stays a 400 (`narrow` takes [-1] wide rows, its step [1] wide ones).
    assert bad_status in ("400", "INVALID_ARGUMENT")
    assert bad_message.startswith("ensemble 'narrow' step 1 (single): input 'IN'")


async def _one(protocol: str, server: RunningServer, model: str, value: float) -> Reply:
    async with AsyncInfer(protocol, server) as infer:
        return await infer(model, value)


async def _bad_shape(protocol: str, server: RunningServer) -> tuple[str, str]:
    """A row two values wide to `narrow`."""
    x = np.ones((1, 2), np.float32)
    module = httpclient if protocol == "http" else grpcclient
    inp = module.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    try:
        with _client(protocol, server) as client:
            client.infer("narrow", [inp])
    except Exception as exc:  # tritonclient's InferenceServerException
        status = str(getattr(exc, "status")()).removeprefix("StatusCode.")  # noqa: B009
        return status, str(getattr(exc, "message")())  # noqa: B009
    return "OK", ""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_step_that_sheds_answers_429_naming_it(
    server: RunningServer, root: Path, protocol: str
) -> None:
    busy = batcher_of(server, f"busy_{protocol}")
    gate = root / "gates" / f"busy_{protocol}"

    async def go() -> tuple[str, str]:
        async with AsyncInfer(protocol, server) as infer:
            running = asyncio.create_task(infer(f"busy_{protocol}", 1))
            await until(busy, lambda b: b.inflight() == 1 and not b.queue_depth(), "1 runs")
            queued = asyncio.create_task(infer(f"busy_{protocol}", 2))
            await until(busy, lambda b: b.queue_depth() == 1, "2 queued")
            shed = await infer(f"shed_{protocol}", 3)
            gate.unlink()
            assert [(await t).status for t in (running, queued)] == [OK[protocol]] * 2
            return shed.status, shed.message

    gate.touch()
    try:
        status, message = asyncio.run(go())
    finally:
        gate.unlink(missing_ok=True)
    assert status == SHED[protocol]
    assert message.startswith(f"ensemble 'shed_{protocol}' step 1 (busy_{protocol}): ")
    assert "queue is full" in message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_priority_goes_to_every_step(server: RunningServer, protocol: str) -> None:
    async def go() -> tuple[list[float], str, str]:
        async with AsyncInfer(protocol, server) as infer:
            ok = await infer("chain", 1, priority=1)
            beyond = await infer("chain", 1, priority=2)  # the steps have one level
            return ok.data, beyond.status, beyond.message

    data, status, message = asyncio.run(go())
    assert data == [144.0]
    assert status == BAD_REQUEST[protocol]
    assert message == (
        "ensemble 'chain' step 1 (double): priority 2 is outside 1..1 (priority_levels of "
        "model 'double')"
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_requests_parameters_reach_the_steps(server: RunningServer, protocol: str) -> None:
    x = np.array([[1.5]], np.float32)
    module = httpclient if protocol == "http" else grpcclient
    inp = module.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(x)
    with _client(protocol, server) as client:
        result = client.infer("scaled", [inp], parameters={"scale": 10})
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 * 10)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_deadline_covers_the_pipeline_and_names_the_step(
    server: RunningServer, root: Path, protocol: str
) -> None:
    tag = f"deadline_{protocol}"
    gate = root / "gates" / f"held_{tag}"
    gate.touch()
    try:

        async def go() -> tuple[str, str]:
            async with AsyncInfer(protocol, server) as infer:
                reply = await infer(f"pipe_{tag}", 3, timeout_us=300_000)
                return reply.status, reply.message

        status, message = asyncio.run(go())
    finally:
        gate.unlink()
    assert status == DEADLINE[protocol]
    assert message.startswith(f"ensemble 'pipe_{tag}' step 2 (held_{tag}): ")
    assert "deadline passed" in message
    wait_for(batcher_of(server, f"held_{tag}"), lambda b: b.inflight() == 0, "the step ended")
    assert calls(root, f"first_{tag}") == [[3.0]]
    assert calls(root, f"last_{tag}") == []  # the step after the deadline never ran


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_that_leaves_cancels_the_steps_not_yet_run(
    server: RunningServer, root: Path, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    tag = f"cancel_{protocol}"
    held = batcher_of(server, f"held_{tag}")
    gate = root / "gates" / f"held_{tag}"
    ensemble = server.server.registry.get(f"pipe_{tag}").batcher
    assert ensemble is not None

    async def go() -> None:
        async with AsyncInfer(protocol, server) as infer:
            leaving = asyncio.create_task(infer(f"pipe_{tag}", 4))
            deadline = time.monotonic() + 30
            while held.inflight() == 0:  # step 2 is executing (held by its gate)
                assert time.monotonic() < deadline, "step 2 never started"
                await asyncio.sleep(0.005)
            leaving.cancel()  # the client gives up: its connection (or gRPC call) ends
            with contextlib.suppress(asyncio.CancelledError):
                await leaving
            while ensemble.inflight():  # the server cancelled the ensemble's request
                assert time.monotonic() < deadline, "the disconnect was never noticed"
                await asyncio.sleep(0.005)

    gate.touch()
    try:
        with caplog.at_level(logging.INFO, logger="inferd.requests"):
            asyncio.run(go())
            deadline = time.monotonic() + 30
            while not [r for r in caplog.records if getattr(r, "reason", "") == "cancelled"]:
                assert time.monotonic() < deadline, "the cancelled request was never logged"
                time.sleep(0.005)
    finally:
        gate.unlink()
    wait_for(held, lambda b: b.inflight() == 0, "step 2's execution ended")
    assert calls(root, f"held_{tag}") == [[8.0]]  # it was already executing
    assert calls(root, f"last_{tag}") == []  # never started
    # One line, at INFO, under the model the client called, naming the step it was in.
    (line,) = [r for r in caplog.records if getattr(r, "reason", "") == "cancelled"]
    assert (line.levelno, getattr(line, "model", "")) == (logging.INFO, f"pipe_{tag}")
    assert f"(in step 2, held_{tag})" in line.getMessage()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failing_branch_answers_at_once_and_cancels_what_waits_on_the_other(
    server: RunningServer, root: Path, protocol: str
) -> None:
    """Concurrent branches: `unlucky` fails once `held` executes (held's gate closed); the
    answer comes without waiting for `held`, and `after`, which reads `held`'s output, never
    starts."""
    held = batcher_of(server, f"held_branch_{protocol}")
    gate = root / "gates" / f"held_branch_{protocol}"
    gate.touch()
    try:
        reply = asyncio.run(_one(protocol, server, f"branches_{protocol}", 13))
        still_held = held.inflight()  # read before the gate opens
    finally:
        gate.unlink()
    assert reply.status == FAILED[protocol]
    failing = f"step 2 (unlucky_branch_{protocol})"
    assert reply.message.startswith(f"ensemble 'branches_{protocol}' {failing}: ")
    assert still_held == 1  # answered while the other branch was still executing
    wait_for(held, lambda b: b.inflight() == 0, "held's execution ended")
    assert calls(root, f"held_branch_{protocol}") == [[13.0]]
    assert calls(root, f"after_branch_{protocol}") == []  # cancelled before it could start


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_64_concurrent_clients_batch_the_steps(
    server: RunningServer, root: Path, protocol: str
) -> None:
    before = len(calls(root, "double"))

    async def go() -> list[str]:
        async with AsyncInfer(protocol, server, connections=64) as infer:
            replies = await asyncio.gather(*(infer("chain", 100 + i) for i in range(64)))
        return [r.status for r in replies]

    assert asyncio.run(go()) == [OK[protocol]] * 64
    executions = calls(root, "double")[before:]
    assert sum(len(rows) for rows in executions) == 64
    # `double` takes 20 ms an execution: requests arriving meanwhile leave together.
    assert len(executions) < 64
    assert max(len(rows) for rows in executions) > 1


def test_statistics_metrics_and_log_per_step(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    def count(model: str) -> float:
        return sum(
            v
            for (name, labels), v in scrape(server).items()
            if name == "inferd_request_duration_seconds_count" and ("model", model) in labels
        )

    with server.client() as c:
        stats = {s["name"]: s for s in c.get("/v2/models/stats").json()["model_stats"]}
        before = {m: count(m) for m in ("chain", "double", "add_ten", "square")}
        chain_before = stats["chain"]["inference_stats"]["success"]["count"]
        with caplog.at_level(logging.INFO, logger="inferd.requests"):
            body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2, 1], "data": [1, 2]}]}
            assert c.post("/v2/models/chain/infer", json=body).status_code == 200
        after = {m: count(m) for m in before}
        stats = {s["name"]: s for s in c.get("/v2/models/stats").json()["model_stats"]}
    assert {m: after[m] - before[m] for m in before} == dict.fromkeys(before, 1.0)
    chain = stats["chain"]
    assert chain["inference_stats"]["success"]["count"] == chain_before + 1
    assert chain["inference_count"] >= 2 and chain["execution_count"] >= 1
    assert stats["square"]["inference_stats"]["success"]["count"] >= 1
    lines = [r for r in caplog.records if getattr(r, "model", "") == "chain"]
    assert lines, "no request log line for the ensemble"
    steps = lines[-1].steps  # type: ignore[attr-defined]
    assert [(s["step"], s["model"]) for s in steps] == [
        (1, "double"),
        (2, "add_ten"),
        (3, "square"),
    ]
    assert "steps 1 (double)" in lines[-1].getMessage()
