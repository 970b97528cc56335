"""The request path's budget, held by counts: inferd's own Python calls per request, for one
small request of `tiny` (an identity model, FP32 [1, 64]) and one request of 32 rows of an
MLP, in process (the DataPlane's steps) and over HTTP JSON, HTTP binary and gRPC to a real
server. A count past its budget (tests/support/call_budgets.json, with a margin) fails,
naming the functions that grew (tests/support/call_budget.py, which says how to raise one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from inferd.dataplane.plane import DataPlane
from inferd.events import CallContext, Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.types import InferRequest, Tensor
from tests.support.call_budget import MODELS, REQUESTS, WIRES, hold, rows, write_repository
from tests.support.call_counter import CallCounter, calls_per_request, profiled_threads
from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("call_budget") / "models")


@pytest.fixture(scope="module")
def counted(repo: Path) -> Iterator[tuple[CallCounter, RunningServer]]:
    counter = CallCounter()
    with profiled_threads(counter), run_server(repo) as server:
        yield counter, server


@pytest.mark.parametrize("wire", sorted(WIRES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_request_stays_within_its_call_budget(
    counted: tuple[CallCounter, RunningServer], wire: str, model: str
) -> None:
    counter, server = counted
    with ExitStack() as stack:
        measured = calls_per_request(counter, WIRES[wire](server, model, stack), REQUESTS)
    hold(f"{wire} {model}", measured)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_an_in_process_request_stays_within_its_call_budget(repo: Path, model: str) -> None:
    """The DataPlane's steps as an adapter takes them, no wire: the core's own share."""
    counter = CallCounter()
    loop = asyncio.new_event_loop()
    telemetry = Telemetry()
    registry = ModelRegistry(repo, telemetry)
    plane = DataPlane(registry, telemetry)
    x = rows(model)
    name = MODELS[model][1]

    async def one() -> None:
        ctx = CallContext("http", "127.0.0.1:1", "", time.time(), time.perf_counter_ns())
        with plane.start(model, "", ctx) as call:
            plane.admit(call)
            request = InferRequest(model, "", [Tensor(name, "FP32", x.shape, x)])
            plane.respond(call, await plane.infer(call, request))

    try:
        with profiled_threads(counter):
            loop.run_until_complete(registry.load_all([model]))
            measured = calls_per_request(counter, lambda: loop.run_until_complete(one()), REQUESTS)
    finally:
        loop.run_until_complete(registry.unload_all())
        loop.close()
    hold(f"in-process {model}", measured)
