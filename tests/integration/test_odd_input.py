"""Correct on odd but valid input, strict on odd invalid input (issue #14, item 5), over real
sockets and both protocols where the case applies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.servers import RunningServer, batcher_of, run_server, wait_for

# OUT = A + B + 100 C, each optional input counting 0 when absent (two optional inputs of one
# shape: requests sending one each have the same shapes); A = 1000 waits while the gate exists.
OPTIONAL_PY = """
import os, time
import numpy as np

class Model:
    def load(self, context):
        self.gate = context.parameters["gate_path"]

    def predict(self, inputs):
        a = inputs["A"]
        if (a == 1000).any():
            give_up = time.monotonic() + 60
            while os.path.exists(self.gate) and time.monotonic() < give_up:
                time.sleep(0.002)
        b, c = inputs.get("B", np.float32(0)), inputs.get("C", np.float32(0))
        return {"OUT": a + b + 100 * c}
"""

OPTIONAL_CONFIG = """
name: "optional"
backend: "python"
max_batch_size: 32
input [
  { name: "A", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "B", data_type: TYPE_FP32, dims: [ 1 ], optional: true },
  { name: "C", data_type: TYPE_FP32, dims: [ 1 ], optional: true }
]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
dynamic_batching { }
parameters { key: "gate_path" value: { string_value: "%s" } }
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "closed"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("odd-input")
    (repo / "optional" / "1").mkdir(parents=True)
    (repo / "optional" / "config.pbtxt").write_text(OPTIONAL_CONFIG % gate)
    (repo / "optional" / "1" / "model.py").write_text(OPTIONAL_PY)
    with run_server(repo) as running:
        yield running


# -- optional inputs ------------------------------------------------------------------------


Case = dict[str, float]  # input name -> its one value


def _optional_http(server: RunningServer, case: Case) -> float:
    inputs = [
        {"name": name, "datatype": "FP32", "shape": [1, 1], "data": [v]} for name, v in case.items()
    ]
    r = httpx.post(f"{server.url}/v2/models/optional/infer", json={"inputs": inputs}, timeout=60)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


def _optional_grpc(server: RunningServer, case: Case) -> float:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        tensors = []
        for name, v in case.items():
            t = grpcclient.InferInput(name, [1, 1], "FP32")
            t.set_data_from_numpy(np.array([[v]], np.float32))
            tensors.append(t)
        out = client.infer("optional", tensors, client_timeout=60).as_numpy("OUT")
        assert out is not None
        return float(out[0, 0])
    finally:
        client.close()


def _expected(case: Case) -> float:
    return case["A"] + case.get("B", 0.0) + 100 * case.get("C", 0.0)


def _case(i: int, optional: str) -> Case:
    """A = i and, when `optional` names one, that input = i + 1."""
    return {"A": float(i)} | ({optional: float(i + 1)} if optional else {})


def test_requests_with_different_optional_inputs_are_answered_right(
    server: RunningServer,
) -> None:
    """The finding: mixed in one batch, 49 of 50 valid requests failed with KeyError."""
    results: dict[int, float] = {}
    cases = {i: _case(i, ("B", "C", "")[i % 3]) for i in range(50)}

    def send(i: int) -> None:
        infer = _optional_http if i % 2 else _optional_grpc
        results[i] = infer(server, cases[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: _expected(case) for i, case in cases.items()}


def test_requests_with_the_same_optional_inputs_still_batch(
    server: RunningServer, gate: Path
) -> None:
    batcher = batcher_of(server, "optional")
    gate.touch()
    results: dict[int, float] = {}

    def send(i: int, case: Case) -> None:
        infer = _optional_http if i % 2 else _optional_grpc
        results[i] = infer(server, case)

    holder = threading.Thread(target=send, args=(-1, {"A": 1000.0}))
    holder.start()
    wait_for(batcher, lambda b: b.inflight() == 1 and b.queue_depth() == 0, "the holder executing")
    threads: list[threading.Thread] = []
    cases: dict[int, Case] = {}
    for group, optional in enumerate(("B", "C", "B")):  # queued in three runs of ten
        for k in range(10):
            i = group * 10 + k
            cases[i] = _case(i, optional)
            threads.append(threading.Thread(target=send, args=(i, cases[i])))
            threads[-1].start()
        wait_for(batcher, lambda b, n=(group + 1) * 10: b.queue_depth() == n, "the run queued")
    before = len(batcher.executions)
    gate.unlink()
    for t in [holder, *threads]:
        t.join(timeout=60)
    assert results == {-1: 1000.0} | {i: _expected(case) for i, case in cases.items()}
    # The holder, then one batch per run: requests sending the same inputs still batch.
    assert [e.requests for e in list(batcher.executions)[before:]] == [1, 10, 10, 10]
