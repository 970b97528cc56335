"""Dynamic batching seen from outside: merges under load, never mixes up rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fault_models import GATED, GATED_MAX_BATCH, blocker_is_executing
from tests.servers import RunningServer, batcher_of, until


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


async def _send_all(
    url: str, model: str, bodies: list[dict[str, object]]
) -> list[dict[str, object]]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        responses = await asyncio.gather(
            *(client.post(f"/v2/models/{model}/infer", json=b) for b in bodies)
        )
    for r in responses:
        assert r.status_code == 200, r.text
    return [r.json() for r in responses]


def _output(doc: dict[str, object], name: str) -> np.ndarray:
    for out in doc["outputs"]:  # type: ignore[attr-defined]
        if out["name"] == name:
            dtype = np.float32 if out["datatype"] == "FP32" else np.int64
            return np.array(out["data"], dtype=dtype).reshape(out["shape"])
    raise KeyError(name)


def test_queued_single_rows_leave_as_one_batch(gated_server: RunningServer, gate: Path) -> None:
    # While the instance executes, arrivals queue and then leave together as one batch. The
    # blocker holds the instance until all of them are queued, so the outcome doesn't depend
    # on how fast the client sends.
    n = 64
    assert n <= GATED_MAX_BATCH
    bodies = [_request(np.full((1, 2), i, np.float32), str(i)) for i in range(n)]
    batcher = batcher_of(gated_server, GATED)
    gate.touch()  # closed: the blocker will hold the instance

    async def send() -> tuple[dict[str, object], list[dict[str, object]]]:
        limits = httpx.Limits(max_connections=n + 1)
        async with httpx.AsyncClient(
            base_url=gated_server.url, timeout=60, limits=limits
        ) as client:

            def post(body: dict[str, object]) -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.post(f"/v2/models/{GATED}/infer", json=body))

            try:
                blocker = post(_request(np.full((1, 2), -1, np.float32), "blocker"))
                await until(batcher, blocker_is_executing, "the blocker to execute", blocker)
                requests = [post(b) for b in bodies]
                await until(batcher, lambda b: b.queue_depth() == n, f"{n} queued requests")
            finally:
                gate.unlink()  # open: never leave the instance held, even when failing
            responses = await asyncio.gather(blocker, *requests)
        for r in responses:
            assert r.status_code == 200, r.text
        first, *rest = (r.json() for r in responses)
        return first, rest

    blocker_doc, docs = asyncio.run(send())
    executions = {int(_output(d, "EXEC")[0, 0]) for d in docs}
    batch_sizes = {int(_output(d, "BATCH")[0, 0]) for d in docs}
    assert len(executions) == 1, f"{n} queued requests ran as {len(executions)} executions"
    assert batch_sizes == {n}
    assert executions.isdisjoint({int(_output(blocker_doc, "EXEC")[0, 0])})
    assert int(_output(blocker_doc, "BATCH")[0, 0]) == 1
    for i, doc in enumerate(docs):  # and every request got its own row back
        assert doc["id"] == str(i)
        np.testing.assert_array_equal(_output(doc, "OUT"), np.full((1, 2), i))


def test_lone_request_runs_alone(server: RunningServer) -> None:
    with server.client() as c:
        doc = c.post(
            "/v2/models/counter/infer", json=_request(np.ones((3, 2), np.float32), "x")
        ).json()
    assert _output(doc, "BATCH").ravel().tolist() == [3, 3, 3]


def test_different_inner_shapes_are_never_merged(server: RunningServer) -> None:
    bodies = [_request(np.full((1, 2 + (i % 3)), i, np.float32), str(i)) for i in range(24)]
    docs = asyncio.run(_send_all(server.url, "slow_counter", bodies))
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(_output(doc, "OUT"), np.full((1, 2 + (i % 3)), i))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=24),
    width=st.integers(min_value=1, max_value=4),
)
def test_each_response_holds_exactly_its_own_rows(
    server: RunningServer, rows: list[int], width: int
) -> None:
    rng = np.random.default_rng(len(rows) * 31 + width)
    payloads = [rng.normal(size=(r, width)).astype(np.float32) for r in rows]
    bodies = [_request(p, f"r{k}") for k, p in enumerate(payloads)]
    docs = asyncio.run(_send_all(server.url, "counter", bodies))
    for k, (doc, payload) in enumerate(zip(docs, payloads, strict=True)):
        assert doc["id"] == f"r{k}"
        np.testing.assert_array_equal(_output(doc, "OUT"), payload)
        # Rows of one request always travel in one execution.
        assert len(set(_output(doc, "EXEC").ravel().tolist())) == 1
