"""The call budgets' cases, shared by the tests that hold them (one process:
tests/integration/protocol/test_call_budget.py; `--engine`'s front end and engine:
tests/integration/engine/test_engine_call_budget.py): the two models, the three wires, and
holding a count to its budget in tests/support/call_budgets.json.

Raising a budget is a deliberate change, in the commit of the feature that needs it, with
the measured cost in its message: rerun with INFERD_WRITE_CALL_BUDGETS=1 to write today's
counts into the file (the test then skips), and commit the file with the change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import pytest
from onnx import TensorProto

from tests.support import http_wire
from tests.support.call_counter import grpc_request
from tests.support.models import builders

BUDGETS = Path(__file__).resolve().parent / "call_budgets.json"
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


def write_repository(root: Path) -> Path:
    """`tiny` (an identity model, FP32 [batch, n]) and a 64-32-16 `mlp`, under `root`."""
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]), root / "tiny" / "1" / "model.onnx"
    )
    builders._save(builders.mlp([64, 32, 16], seed=0), root / "mlp" / "1" / "model.onnx")
    for name, config in CONFIGS.items():
        (root / name / "config.pbtxt").write_text(config)
    return root


def rows(model: str) -> np.ndarray:
    """The request's input: 1 row of `tiny`, 32 of `mlp`, 64 values each."""
    n = MODELS[model][0]
    return np.arange(n * 64, dtype=np.float32).reshape(n, 64) / 1000


class Endpoints(Protocol):
    """Where a server answers (tests/support/servers.RunningServer, or a front end)."""

    @property
    def port(self) -> int: ...  # HTTP, on 127.0.0.1

    @property
    def url(self) -> str: ...  # http://127.0.0.1:PORT

    @property
    def grpc_address(self) -> str: ...  # 127.0.0.1:PORT


Wire = Callable[[Endpoints, str, ExitStack], Callable[[], object]]


def _one_write(
    server: Endpoints, model: str, stack: ExitStack, **content: Any
) -> Callable[[], object]:
    """An infer request of `model` with `content` (httpx's arguments), as the bytes an
    httpx.Client sends, over one keep-alive connection and written whole each time: httpx
    writes the head and the body apart, and whether the server then read them in one piece
    or two moved a count by up to 6% from run to run."""
    with httpx.Client(base_url=server.url) as client:
        request = client.build_request("POST", f"/v2/models/{model}/infer", **content)
    head = b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)
    head += b"".join(b"%s: %s\r\n" % field for field in request.headers.raw)
    data = head + b"\r\n" + request.read()
    wire = http_wire.Wire(server)
    stack.callback(wire.close)

    def send() -> object:
        wire.send(data)
        status, _, body = wire.response()
        assert status == 200, body
        return body

    return send


def _http_json(server: Endpoints, model: str, stack: ExitStack) -> Callable[[], object]:
    x = rows(model)
    body = {"inputs": [{"name": MODELS[model][1], "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}  # fmt: skip
    return _one_write(server, model, stack, json=body)


def _http_binary(server: Endpoints, model: str, stack: ExitStack) -> Callable[[], object]:
    x = rows(model)
    header = json.dumps(
        {
            "inputs": [{"name": MODELS[model][1], "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": MODELS[model][2], "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return _one_write(server, model, stack, content=header + x.tobytes(), headers=headers)


def _grpc(server: Endpoints, model: str, stack: ExitStack) -> Callable[[], object]:
    _, name, output = MODELS[model]
    return grpc_request(server.grpc_address, model, name, rows(model), stack, output)


WIRES: dict[str, Wire] = {
    "http-json": _http_json,
    "http-binary": _http_binary,
    "grpc": _grpc,
}


def _budgets() -> dict[str, Any]:
    return json.loads(BUDGETS.read_text()) if BUDGETS.exists() else {}


def hold(case: str, measured: dict[str, float]) -> None:
    """Fail if `measured` (calls per request, by function) is past `case`'s budget (+5%),
    naming the functions that grew; with INFERD_WRITE_CALL_BUDGETS=1, write it and skip."""
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
