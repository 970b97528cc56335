"""Admission control, deadlines and cancellation: refuse fast, never run what nobody awaits.

The full queue, the `timeout` parameter and priorities run over HTTP and gRPC from one
table of outcomes (tests/support/async_infer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.scheduling.batcher import DynamicBatcher
from tests.support.admission_models import body, executed, gate_closed, write_admission_models
from tests.support.async_infer import (
    BAD_REQUEST,
    DEADLINE,
    OK,
    PROTOCOLS,
    SHED,
    AsyncInfer,
    Reply,
)
from tests.support.metrics_scrape import scrape, value
from tests.support.protocol_clients import Client
from tests.support.servers import RunningServer, batcher_of, run_server, until, wait_for


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("admission")
    write_admission_models(root)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    with run_server(repo / "models") as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_full_queue_sheds_with_429_and_retry_after(
    server: RunningServer, repo: Path, protocol: str
) -> None:
    # One executing, two queued (max_queue_size 2), the rest refused at once.
    batcher = batcher_of(server, "bounded")
    before = len(executed(repo, "bounded"))

    async def scenario(release: Callable[[], None]) -> list[Reply]:
        async with AsyncInfer(protocol, server) as infer:

            def send(i: int) -> asyncio.Task[Reply]:
                return asyncio.create_task(infer("bounded", i))

            admitted = [send(1)]
            await until(
                batcher, lambda b: b.inflight() == 1 and b.queue_depth() == 0, "request 1 executing"
            )
            # One at a time, so that they queue in this order.
            admitted.append(send(2))
            await until(batcher, lambda b: b.queue_depth() == 1, "request 2 queued")
            admitted.append(send(3))
            await until(batcher, lambda b: b.queue_depth() == 2, "request 3 queued")
            assert not any(t.done() for t in admitted), "answered while the gate was closed"
            # The queue is full and request 1 holds the instance until released.
            refused = [await send(i) for i in range(4, 7)]
            release()
            return [*await asyncio.gather(*admitted), *refused]

    with gate_closed(repo, "bounded") as release:
        replies = asyncio.run(scenario(release))
    statuses = [r.status for r in replies]
    assert statuses == [OK[protocol]] * 3 + [SHED[protocol]] * 3, statuses
    for r in replies[3:]:
        assert "queue is full" in r.message
        if protocol == "http":
            assert r.headers["retry-after"] == "1"
    assert executed(repo, "bounded")[before:] == [1, 2, 3]  # the refused never ran


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_timeout_parameter_removes_a_queued_request(
    server: RunningServer, repo: Path, protocol: str
) -> None:
    timed = f"timed_{protocol}"
    batcher = batcher_of(server, timed)
    before = len(executed(repo, timed))

    async def scenario(release: Callable[[], None]) -> tuple[Reply, Reply]:
        async with AsyncInfer(protocol, server) as infer:
            first = asyncio.create_task(infer(timed, 1))
            await until(batcher, _executing_alone, "request 1 executing")
            assert not first.done(), "request 1 was answered while the gate was closed"
            second = await infer(timed, 2, timeout_us=100_000)  # 100 ms, queued
            release()
            return await first, second

    with gate_closed(repo, timed) as release:
        first, second = asyncio.run(scenario(release))
    assert (first.status, second.status) == (OK[protocol], DEADLINE[protocol])
    assert "deadline passed while it was queued" in second.message
    wait_for(batcher, _idle, "the queue drained")
    assert executed(repo, timed)[before:] == [1]


def _executing_alone(batcher: DynamicBatcher) -> bool:
    return batcher.inflight() == 1 and batcher.queue_depth() == 0


def _idle(batcher: DynamicBatcher) -> bool:
    return batcher.inflight() == 0 and batcher.queue_depth() == 0


def test_timeout_header_is_the_clients_deadline(server: RunningServer, repo: Path) -> None:
    # Request 12's 100 ms deadline passes while it is queued behind request 11, which holds
    # the instance until released; `unmeasured` has never timed an execution, so admission
    # has no estimate to refuse 12 with, whatever ran before this test.
    batcher = batcher_of(server, "unmeasured")
    assert batcher.estimated_wait_s(1) is None, "`unmeasured` must have no execution timed"
    url = "/v2/models/unmeasured/infer"

    async def scenario(release: Callable[[], None]) -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = asyncio.create_task(client.post(url, json=body(11)))
            await until(
                batcher,
                lambda b: b.inflight() == 1 and b.queue_depth() == 0,
                "request 11 executing",
                first,
            )
            second = await client.post(url, json=body(12), headers={"inferd-timeout-ms": "100"})
            release()
            return await first, second

    with gate_closed(repo, "unmeasured") as release:
        first, second = asyncio.run(scenario(release))
    assert (first.status_code, second.status_code) == (200, 504)
    assert "deadline passed while it was queued" in second.json()["error"]
    # The batcher drops the timed-out entry when it reaches it instead of executing it.
    asyncio.run(
        until(
            batcher,
            lambda b: b.inflight() == 0 and b.queue_depth() == 0,
            "request 12 dropped from the queue",
        )
    )
    assert 12 not in executed(repo, "unmeasured")
    with server.client() as c:
        r = c.post(url, json=body(1), headers={"inferd-timeout-ms": "soon"})
    assert r.status_code == 400
    assert "inferd-timeout-ms" in r.json()["error"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_deadline_the_queue_ahead_makes_too_short_is_shed(
    server: RunningServer, repo: Path, protocol: str
) -> None:
    # `backlogged` has timed one ~300 ms execution; with one request executing and two
    # queued, a request with 600 ms left would need ~1 s: busy, so 429 and "retry later"
    # (its deadline is longer than one execution, so on an idle model it would succeed).
    batcher = batcher_of(server, "backlogged")
    with server.client() as c:
        assert c.post("/v2/models/backlogged/infer", json=body(20)).status_code == 200
    assert batcher.estimated_wait_s(1) is not None

    async def scenario(release: Callable[[], None]) -> list[Reply]:
        async with AsyncInfer(protocol, server) as infer:

            def send(i: int) -> asyncio.Task[Reply]:
                return asyncio.create_task(infer("backlogged", i))

            admitted = [send(21)]
            await until(batcher, _executing_alone, "request 21 executing")
            admitted.append(send(22))
            await until(batcher, lambda b: b.queue_depth() == 1, "request 22 queued")
            admitted.append(send(23))
            await until(batcher, lambda b: b.queue_depth() == 2, "request 23 queued")
            assert not any(t.done() for t in admitted), "answered while the gate was closed"
            refused = await infer("backlogged", 30, deadline_ms=600)
            release()
            return [*await asyncio.gather(*admitted), refused]

    with gate_closed(repo, "backlogged") as release:
        replies = asyncio.run(scenario(release))
    *admitted, refused = replies
    assert [r.status for r in admitted] == [OK[protocol]] * 3
    assert refused.status == SHED[protocol], refused
    if protocol == "http":
        assert refused.headers["retry-after"] == "1"
    assert "cannot meet the request's deadline now" in refused.message
    assert "of work ahead of it" in refused.message
    assert "retry later" in refused.message
    wait_for(batcher, _idle, "the queue drained")
    assert 30 not in executed(repo, "backlogged")


# A deadline shorter than the model's execution time, on an idle model: no retry can ever
# succeed, so it is the request's error (400 / INVALID_ARGUMENT), never 429 "retry later".
# (protocol, how the client sets its deadline, the status tritonclient reports)
UNMEETABLE_DEADLINES = [
    ("http", {"headers": {"inferd-timeout-ms": "400"}}, "400"),
    ("grpc", {"client_timeout": 0.4}, "StatusCode.INVALID_ARGUMENT"),
]


@pytest.mark.parametrize(
    ("protocol", "deadline", "status"),
    UNMEETABLE_DEADLINES,
    ids=[c[0] for c in UNMEETABLE_DEADLINES],
)
def test_deadline_shorter_than_one_execution_is_the_requests_error(
    server: RunningServer, repo: Path, protocol: str, deadline: dict[str, Any], status: str
) -> None:
    client = Client(protocol, server)
    batcher = batcher_of(server, "ponderous")
    ok = {"IN": (np.array([[40]], np.float32), "FP32")}
    try:
        client.infer("ponderous", ok)  # times one ~800 ms execution
        assert batcher.estimated_wait_s(1) is not None
        assert batcher.inflight() == 0  # idle: nothing queued or executing
        with pytest.raises(InferenceServerException) as info:
            client.infer("ponderous", {"IN": (np.array([[41]], np.float32), "FP32")}, **deadline)
    finally:
        client.raw.close()
    assert info.value.status() == status, info.value
    message = str(info.value.message())
    assert "cannot answer within the request's deadline" in message
    assert "typical execution time is about" in message
    assert "retry later" not in message
    wait_for(batcher, _idle, "the model idle")
    assert 41 not in executed(repo, "ponderous")


def test_unmeetable_deadline_has_no_retry_after(server: RunningServer) -> None:
    url = "/v2/models/ponderous/infer"
    with server.client() as c:
        assert c.post(url, json=body(42)).status_code == 200  # an execution is timed
        r = c.post(url, json=body(43), headers={"inferd-timeout-ms": "400"})
    assert r.status_code == 400, r.text
    assert "Retry-After" not in r.headers
    assert "typical execution time" in r.json()["error"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_higher_priority_runs_first(server: RunningServer, repo: Path, protocol: str) -> None:
    batcher = batcher_of(server, "prioritised")
    before = len(executed(repo, "prioritised"))

    async def scenario(release: Callable[[], None]) -> tuple[list[Reply], Reply]:
        async with AsyncInfer(protocol, server) as infer:

            def send(value: float, priority: int = 0) -> asyncio.Task[Reply]:
                return asyncio.create_task(infer("prioritised", value, priority))

            sent = [send(41)]  # runs first, occupies the instance
            await until(
                batcher,
                lambda b: b.inflight() == 1 and b.queue_depth() == 0,
                "request 41 executing",
            )
            sent.append(send(42))  # default level 2
            await until(batcher, lambda b: b.queue_depth() == 1, "request 42 queued")
            sent.append(send(43, priority=1))  # level 1 overtakes
            await until(batcher, lambda b: b.queue_depth() == 2, "request 43 queued")
            assert not any(t.done() for t in sent), "answered while the gate was closed"
            release()
            replies = list(await asyncio.gather(*sent))
            return replies, await infer("prioritised", 1, priority=3)

    with gate_closed(repo, "prioritised") as release:
        replies, out_of_range = asyncio.run(scenario(release))
    assert [r.status for r in replies] == [OK[protocol]] * 3
    assert executed(repo, "prioritised")[before:] == [41, 43, 42]
    assert out_of_range.status == BAD_REQUEST[protocol]
    assert "priority 3 is outside 1..2" in out_of_range.message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_disconnected_client_request_never_runs(
    server: RunningServer, repo: Path, protocol: str
) -> None:
    batcher = batcher_of(server, "slow")
    cancelled_before = _cancelled(server)

    async def scenario(release: Callable[[], None]) -> None:
        async with AsyncInfer(protocol, server) as keeper, AsyncInfer(protocol, server) as gone:
            busy = asyncio.create_task(keeper("slow", 51))
            await until(batcher, _executing_alone, "request 51 executing")
            leaving = asyncio.create_task(gone("slow", 52))
            await until(batcher, lambda b: b.queue_depth() == 1, "request 52 queued")
            leaving.cancel()  # the client gives up: its connection (or gRPC call) ends
            with contextlib.suppress(asyncio.CancelledError):
                await leaving
            # The server cancels its request while the instance is still busy (it is
            # dropped, not run, when the queue reaches it).
            deadline = time.monotonic() + 30
            while _cancelled(server) == cancelled_before:
                assert time.monotonic() < deadline, "the disconnect was never noticed"
                await asyncio.sleep(0.01)
            assert batcher.queue_depth() == 0  # a cancelled request leaves the queue at once
            release()
            assert (await busy).status == OK[protocol]

    with gate_closed(repo, "slow") as release:
        asyncio.run(scenario(release))
    wait_for(batcher, _idle, "the queue drained")
    assert 51 in executed(repo, "slow")
    assert 52 not in executed(repo, "slow")


def _cancelled(server: RunningServer) -> float:
    labels = {"model": "slow", "version": "1", "reason": "cancelled"}
    return value(scrape(server), "inferd_request_failure_total", **labels)


def test_grpc_full_queue_is_resource_exhausted(server: RunningServer) -> None:
    channel = grpc.insecure_channel(server.grpc_address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def request(v: float) -> pb.ModelInferRequest:
        req = pb.ModelInferRequest(model_name="bounded")
        req.inputs.add(name="IN", datatype="FP32", shape=[1, 1])
        req.raw_input_contents.append(np.array([v], np.float32).tobytes())
        return req

    calls = [stub.ModelInfer.future(request(60 + i)) for i in range(6)]
    codes = []
    for call in calls:
        try:
            call.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    channel.close()
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_wide_inflight_limit(repo: Path, protocol: str) -> None:
    async def scenario(running: RunningServer, batcher: DynamicBatcher) -> list[Reply]:
        async with AsyncInfer(protocol, running) as infer:

            def send(i: int) -> asyncio.Task[Reply]:
                return asyncio.create_task(infer("slow", i))

            admitted = [send(70)]
            await until(batcher, _executing_alone, "request 70 executing")
            admitted.append(send(71))
            await until(batcher, lambda b: b.queue_depth() == 1, "request 71 queued")
            assert not any(t.done() for t in admitted), "answered while the gate was closed"
            refused = [await send(72), await send(73)]  # two in flight: the server's limit
            release()
            return [*await asyncio.gather(*admitted), *refused]

    with (
        run_server(repo / "models", max_inflight_requests=2) as running,
        gate_closed(repo, "slow") as release,
    ):
        replies = asyncio.run(scenario(running, batcher_of(running, "slow")))
    assert [r.status for r in replies] == [OK[protocol]] * 2 + [SHED[protocol]] * 2
    assert all("--max-inflight-requests" in r.message for r in replies[2:])
