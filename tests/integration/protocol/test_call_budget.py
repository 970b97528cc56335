"""The request path's budget, held by counts: inferd's own Python calls per request, for one
small request of `tiny` (an identity model, FP32 [1, 64]) and one request of 32 rows of an
MLP, in process (the DataPlane's steps) and over HTTP JSON, HTTP binary and gRPC to a real
server. A count past its budget (tests/support/call_budgets.json, with a margin) fails,
naming the functions that grew.

Raising a budget is a deliberate change, in the commit of the feature that needs it, with
the measured cost in its message: rerun with INFERD_WRITE_CALL_BUDGETS=1 to write today's
counts into the file (the test then skips), and commit the file with the change.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto

from inferd.dataplane.plane import DataPlane
from inferd.events import CallContext, Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.types import InferRequest, Tensor
from tests.support.call_counter import (
    CallCounter,
    calls_per_request,
    grpc_request,
    profiled_threads,
)
from tests.support.models import builders
from tests.support.servers import RunningServer, run_server

BUDGETS = Path(__file__).resolve().parents[2] / "support" / "call_budgets.json"
WRITE = os.environ.get("INFERD_WRITE_CALL_BUDGETS") == "1"
REQUESTS = 100
MARGIN = 1.05  # counts move a little with what the loop finds ready; a feature moves more

MODELS = {
    "tiny": (1, "INPUT0", "OUTPUT0"),  # rows, input, output
    "mlp": (32, "input", "probabilities"),
}
CONFIGS = {
    "tiny": 'name: "tiny"\nbackend: "onnxruntime"\nmax_batch_size: 8\n',
    "mlp": 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 32\n'
    'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n',
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("call_budget") / "models"
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]), root / "tiny" / "1" / "model.onnx"
    )
    builders._save(builders.mlp([64, 32, 16], seed=0), root / "mlp" / "1" / "model.onnx")
    for name, config in CONFIGS.items():
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def counted(repo: Path) -> Iterator[tuple[CallCounter, RunningServer]]:
    counter = CallCounter()
    with profiled_threads(counter), run_server(repo) as server:
        yield counter, server


def _rows(model: str) -> np.ndarray:
    rows = MODELS[model][0]
    return np.arange(rows * 64, dtype=np.float32).reshape(rows, 64) / 1000


Wire = Callable[[RunningServer, str, ExitStack], Callable[[], object]]


def _http_json(server: RunningServer, model: str, stack: ExitStack) -> Callable[[], object]:
    client = stack.enter_context(httpx.Client(base_url=server.url, timeout=30))
    x = _rows(model)
    body = {"inputs": [{"name": MODELS[model][1], "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}  # fmt: skip

    def request() -> object:
        r = client.post(f"/v2/models/{model}/infer", json=body)
        assert r.status_code == 200, r.text
        return r

    return request


def _http_binary(server: RunningServer, model: str, stack: ExitStack) -> Callable[[], object]:
    client = stack.enter_context(httpx.Client(base_url=server.url, timeout=30))
    x = _rows(model)
    header = json.dumps(
        {
            "inputs": [{"name": MODELS[model][1], "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": MODELS[model][2], "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    headers = {"Inference-Header-Content-Length": str(len(header))}

    def request() -> object:
        r = client.post(f"/v2/models/{model}/infer", content=header + x.tobytes(), headers=headers)
        assert r.status_code == 200, r.text
        return r

    return request


def _grpc(server: RunningServer, model: str, stack: ExitStack) -> Callable[[], object]:
    _, name, output = MODELS[model]
    return grpc_request(server.grpc_address, model, name, _rows(model), stack, output)


WIRES: dict[str, Wire] = {
    "http-json": _http_json,
    "http-binary": _http_binary,
    "grpc": _grpc,
}


def _budgets() -> dict[str, Any]:
    return json.loads(BUDGETS.read_text()) if BUDGETS.exists() else {}


def _hold(case: str, measured: dict[str, float]) -> None:
    total = sum(measured.values())
    budgets = _budgets()
    if WRITE:
        functions = {name: round(n, 2) for name, n in sorted(measured.items())}
        budgets[case] = {"calls": round(total, 1), "functions": functions}
        BUDGETS.write_text(json.dumps(budgets, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {case}: {total:.1f} calls per request")
    assert case in budgets, f"no budget for {case}: run with INFERD_WRITE_CALL_BUDGETS=1"
    budget = budgets[case]
    if total <= budget["calls"] * MARGIN:
        return
    before = budget["functions"]
    grew = sorted(
        ((name, before.get(name, 0.0), n) for name, n in measured.items()
         if n > before.get(name, 0.0) + 0.05),
        key=lambda row: row[1] - row[2],
    )  # fmt: skip
    lines = [f"  {name}: {was:g} -> {now:.2f}" for name, was, now in grew]
    raise AssertionError(
        f"{case}: {total:.1f} inferd calls per request, budget {budget['calls']} "
        f"(+{(MARGIN - 1) * 100:.0f}%); calls that grew:\n" + "\n".join(lines)
    )


@pytest.mark.parametrize("wire", sorted(WIRES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_request_stays_within_its_call_budget(
    counted: tuple[CallCounter, RunningServer], wire: str, model: str
) -> None:
    counter, server = counted
    with ExitStack() as stack:
        measured = calls_per_request(counter, WIRES[wire](server, model, stack), REQUESTS)
    _hold(f"{wire} {model}", measured)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_an_in_process_request_stays_within_its_call_budget(repo: Path, model: str) -> None:
    """The DataPlane's steps as an adapter takes them, no wire: the core's own share."""
    counter = CallCounter()
    loop = asyncio.new_event_loop()
    telemetry = Telemetry()
    registry = ModelRegistry(repo, telemetry)
    plane = DataPlane(registry, telemetry)
    x = _rows(model)
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
    _hold(f"in-process {model}", measured)
