"""Dynamic batching seen from outside: merges under load, never mixes up rows.

Every case runs over HTTP and gRPC (`PROTOCOLS` of tests/support/async_infer.py), with concurrent
requests from one client of each kind: both adapters feed one scheduler, so they batch alike.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import InferInput

from tests.support.async_infer import PROTOCOLS, AsyncInfer
from tests.support.fault_models import GATED, GATED_MAX_BATCH, blocker_is_executing
from tests.support.servers import RunningServer, batcher_of, until


@dataclass
class Answer:
    id: str
    outputs: dict[str, np.ndarray]


class Client(AsyncInfer):
    """Concurrent requests over HTTP (JSON, httpx) or gRPC (tritonclient's asyncio client)."""

    def __init__(self, protocol: str, server: RunningServer, connections: int) -> None:
        super().__init__(protocol, server, timeout_s=60, connections=connections)

    async def infer(self, model: str, values: np.ndarray, request_id: str) -> Answer:
        if self.http is not None:
            r = await self.http.post(f"/v2/models/{model}/infer", json=_request(values, request_id))
            assert r.status_code == 200, r.text
            doc = r.json()
            return Answer(doc["id"], {o["name"]: _array(o) for o in doc["outputs"]})
        inp = InferInput("IN", list(values.shape), "FP32")
        inp.set_data_from_numpy(values)
        result = await self.grpc.infer(model, [inp], request_id=request_id)
        response = result.get_response()
        return Answer(response.id, {o.name: result.as_numpy(o.name) for o in response.outputs})

    async def infer_all(self, model: str, requests: list[tuple[np.ndarray, str]]) -> list[Answer]:
        return list(await asyncio.gather(*(self.infer(model, v, i) for v, i in requests)))


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _request(values: np.ndarray, request_id: str) -> dict[str, object]:
    return {
        "id": request_id,
        "inputs": [
            {
                "name": "IN",
                "datatype": "FP32",
                "shape": list(values.shape),
                "data": values.ravel().tolist(),
            }
        ],
    }


def _array(out: dict[str, Any]) -> np.ndarray:
    dtype = np.float32 if out["datatype"] == "FP32" else np.int64
    return np.array(out["data"], dtype=dtype).reshape(out["shape"])


def test_queued_single_rows_leave_as_one_batch(
    gated_server: RunningServer, gate: Path, protocol: str
) -> None:
    # While the instance executes, arrivals queue and then leave together as one batch. The
    # blocker holds the instance until all of them are queued, so the outcome doesn't depend
    # on how fast the client sends.
    n = 64
    assert n <= GATED_MAX_BATCH
    batcher = batcher_of(gated_server, GATED)
    gate.touch()  # closed: the blocker will hold the instance

    async def send() -> tuple[Answer, list[Answer]]:
        async with Client(protocol, gated_server, n + 1) as client:

            def post(value: float, request_id: str) -> asyncio.Task[Answer]:
                values = np.full((1, 2), value, np.float32)
                return asyncio.create_task(client.infer(GATED, values, request_id))

            try:
                blocker = post(-1, "blocker")
                await until(batcher, blocker_is_executing, "the blocker to execute")
                requests = [post(i, str(i)) for i in range(n)]
                await until(batcher, lambda b: b.queue_depth() == n, f"{n} queued requests")
                assert not blocker.done(), "the blocker was answered while the gate was closed"
            finally:
                gate.unlink()  # open: never leave the instance held, even when failing
            first, *rest = await asyncio.gather(blocker, *requests)
        return first, rest

    blocker, answers = asyncio.run(send())
    executions = {int(a.outputs["EXEC"][0, 0]) for a in answers}
    batch_sizes = {int(a.outputs["BATCH"][0, 0]) for a in answers}
    assert len(executions) == 1, f"{n} queued requests ran as {len(executions)} executions"
    assert batch_sizes == {n}
    assert executions.isdisjoint({int(blocker.outputs["EXEC"][0, 0])})
    assert int(blocker.outputs["BATCH"][0, 0]) == 1
    for i, answer in enumerate(answers):  # and every request got its own row back
        assert answer.id == str(i)
        np.testing.assert_array_equal(answer.outputs["OUT"], np.full((1, 2), i))


def test_lone_request_runs_alone(server: RunningServer, protocol: str) -> None:
    async def send() -> Answer:
        async with Client(protocol, server, 1) as client:
            return await client.infer("counter", np.ones((3, 2), np.float32), "x")

    assert asyncio.run(send()).outputs["BATCH"].ravel().tolist() == [3, 3, 3]


def test_different_inner_shapes_are_never_merged(server: RunningServer, protocol: str) -> None:
    requests = [(np.full((1, 2 + (i % 3)), i, np.float32), str(i)) for i in range(24)]

    async def send() -> list[Answer]:
        async with Client(protocol, server, len(requests)) as client:
            return await client.infer_all("slow_counter", requests)

    for i, answer in enumerate(asyncio.run(send())):
        np.testing.assert_array_equal(answer.outputs["OUT"], np.full((1, 2 + (i % 3)), i))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=24),
    width=st.integers(min_value=1, max_value=4),
)
def test_each_response_holds_exactly_its_own_rows(
    server: RunningServer, protocol: str, rows: list[int], width: int
) -> None:
    rng = np.random.default_rng(len(rows) * 31 + width)
    payloads = [rng.normal(size=(r, width)).astype(np.float32) for r in rows]
    requests = [(p, f"r{k}") for k, p in enumerate(payloads)]

    async def send() -> list[Answer]:
        async with Client(protocol, server, len(requests)) as client:
            return await client.infer_all("counter", requests)

    for k, (answer, payload) in enumerate(zip(asyncio.run(send()), payloads, strict=True)):
        assert answer.id == f"r{k}"
        np.testing.assert_array_equal(answer.outputs["OUT"], payload)
        # Rows of one request always travel in one execution.
        assert len(set(answer.outputs["EXEC"].ravel().tolist())) == 1
