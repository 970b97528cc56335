"""Readiness says whether the model can serve, not whether one client sent garbage (issue 34).

`text` is examples/models/text_stats without its `text_inputs` parameter: the server no longer
refuses invalid UTF-8 with a 400, and the model itself raises on it (500). Before, five such
requests in a row from one client made the model and the server not ready (503) while valid
requests still succeeded. A model that fails every request must still turn not ready.

Every case runs over HTTP and gRPC (tritonclient), each protocol on models of its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.support.fault_models import SWITCHABLE_PY, param, write_model
from tests.support.metrics_scrape import scrape, value
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, batcher_of, run_server, wait_for

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"
THRESHOLD = 5  # unready_after_failures' default
BAD_IN_A_ROW = 40 * THRESHOLD
BAD_UTF8 = b"\xff\xfe not text"

# Fails every request, zeros (its warm-up sample) included, while `flag_path` exists: the
# "alive but answering 500" incident (DESIGN.md, lesson 2).
BROKEN_PY = """
import os

class Model:
    def load(self, context):
        self.flag = context.parameters["flag_path"]

    def predict(self, inputs):
        if os.path.exists(self.flag):
            raise RuntimeError("the model is broken on purpose")
        return {"OUT": inputs["IN"] + 1}
"""

# In a worker process of its own (isolation: process), which it kills on a negative value
# (one client's hostile input), or on every input while `flag_path` exists.
CRASHING_PY = """
import os

class Model:
    def load(self, context):
        self.flag = context.parameters["flag_path"]

    def predict(self, inputs):
        x = inputs["IN"]
        if (x < 0).any() or os.path.exists(self.flag):
            os._exit(1)
        return {"OUT": x + 1}
"""


def _text_model(repo: Path, name: str) -> None:
    shutil.copytree(EXAMPLES / "text_stats", repo / name)
    config = repo / name / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace('name: "text_stats"', f'name: "{name}"')
    lines = [line for line in text.splitlines() if "text_inputs" not in line]
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def flags(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flags")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, flags: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("readiness")
    for protocol in PROTOCOLS:
        for case in ("fresh", "served"):
            _text_model(repo, f"text_{case}_{protocol}")
        for name, code, extra in (
            ("broken", BROKEN_PY, ""),
            ("switchable", SWITCHABLE_PY, ""),
            ("crash_one", CRASHING_PY, param("isolation", "process")),
            ("crash_all", CRASHING_PY, param("isolation", "process")),
        ):
            model = f"{name}_{protocol}"
            write_model(
                repo,
                model,
                code,
                "dynamic_batching { }\n" + param("flag_path", flags / model) + extra,
                max_batch_size=8,
            )
    with run_server(repo) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


FAILED = {"http": "500", "grpc": "StatusCode.INTERNAL"}  # the model raised


def _infer(client: Client, model: str, tensors: dict[str, Any]) -> tuple[str, Any]:
    """("ok", the result) or (the status, the error's message)."""
    try:
        return "ok", client.infer(model, tensors)
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()


def _text(client: Client, model: str, text: bytes) -> tuple[str, Any]:
    return _infer(client, model, {"text": (np.array([[text]], dtype=object), "BYTES")})


def _value(client: Client, model: str, x: float) -> tuple[str, Any]:
    return _infer(client, model, {"IN": (np.array([[x]], dtype=np.float32), "FP32")})


def _ready(client: Client, model: str) -> tuple[bool, bool]:
    """(the model's readiness, the server's)."""
    return bool(client.raw.is_model_ready(model)), bool(client.raw.is_server_ready())


def _probes(server: RunningServer, model: str) -> dict[str, float]:
    metrics = scrape(server)
    return {
        result: value(
            metrics, "inferd_readiness_probes_total", model=model, version="1", result=result
        )
        for result in ("passed", "failed")
    }


@dataclass(frozen=True)
class Garbage:
    """One client sends BAD_IN_A_ROW requests the model raises on, one after the other."""

    id: str
    served: bool  # valid requests came first (their input is what the probe re-runs)

    def model(self, protocol: str) -> str:
        return f"text_{self.id}_{protocol}"


GARBAGE = [Garbage("fresh", served=False), Garbage("served", served=True)]


@pytest.mark.parametrize("case", GARBAGE, ids=[c.id for c in GARBAGE])
def test_one_clients_invalid_input_never_changes_readiness(
    server: RunningServer, client: Client, case: Garbage
) -> None:
    model = case.model(client.protocol)
    if case.served:
        status, result = _text(client, model, "héllo".encode())
        assert status == "ok", result
    before = value(
        scrape(server),
        "inferd_request_failure_total",
        model=model,
        version="1",
        reason="model_error",
    )
    for i in range(BAD_IN_A_ROW):
        status, message = _text(client, model, BAD_UTF8)
        assert status == FAILED[client.protocol], (i, message)
        assert "can't decode byte 0xff" in message, message
        assert _ready(client, model) == (True, True), f"not ready after {i + 1} bad requests"
    # Valid requests still succeed, with the model's answer.
    status, result = _text(client, model, "héllo wörld".encode())
    assert status == "ok", result
    assert result.as_numpy("upper").tolist() == [["HÉLLO WÖRLD".encode()]]
    assert result.as_numpy("length").tolist() == [[11]]
    metrics = scrape(server)
    failed = value(
        metrics, "inferd_request_failure_total", model=model, version="1", reason="model_error"
    )
    assert failed - before == BAD_IN_A_ROW  # each one was the model's error, and counted
    probes = _probes(server, model)
    assert probes["passed"] >= 1, probes  # readiness asked, and the model answered
    assert probes["failed"] == 0, probes


@dataclass(frozen=True)
class Failing:
    """A model that fails every request from some point on."""

    id: str
    name: str  # the model, without the protocol

    def model(self, protocol: str) -> str:
        return f"{self.name}_{protocol}"


FAILING = [
    # Fails every input, its warm-up sample (zeros) too.
    Failing("everything", "broken"),
    # Fails every input it served before, but still answers zeros: the probe re-runs an
    # input that succeeded, not only the warm-up sample.
    Failing("every-real-input", "switchable"),
]


@pytest.mark.parametrize("case", FAILING, ids=[c.id for c in FAILING])
def test_a_model_failing_every_request_is_not_ready(
    server: RunningServer, flags: Path, client: Client, case: Failing
) -> None:
    model = case.model(client.protocol)
    status, result = _value(client, model, 1.0)
    assert status == "ok", result
    labels = {"model": model, "version": "1"}
    before = scrape(server)
    (flags / model).touch()
    try:
        for i in range(THRESHOLD):
            assert _ready(client, model) == (True, True), f"not ready after {i} failures"
            status, message = _value(client, model, float(i + 2))
            assert status == FAILED[client.protocol], message
        assert _ready(client, model) == (False, False)
        with server.client() as http:
            assert http.get(f"/v2/models/{model}/ready").status_code == 503
            assert http.get("/v2/health/ready").status_code == 503
        after = scrape(server)
        # What the alert InferdModelFailingEveryRequest reads: failures, no success.
        for name, reason, grew in (
            ("inferd_request_failure_total", "model_error", THRESHOLD),
            ("inferd_request_success_total", None, 0),
        ):
            series = {**labels, "reason": reason} if reason else labels
            assert value(after, name, **series) - value(before, name, **series) == grew, name
        assert _probes(server, model) == {"passed": 0, "failed": 1}
    finally:
        (flags / model).unlink()
    # Fixed: the next request succeeds, and the model is ready again.
    status, result = _value(client, model, 3.0)
    assert status == "ok", result
    assert _ready(client, model) == (True, True)


@dataclass(frozen=True)
class Crash:
    """Requests that kill a process-isolated model's worker: after the fifth, the probe
    waits for the new worker and executes there."""

    id: str
    name: str
    value: float  # what the requests send
    broken: bool  # the model crashes on every input (else only on this one's)

    def model(self, protocol: str) -> str:
        return f"{self.name}_{protocol}"


CRASHES = [
    Crash("one-clients-input", "crash_one", -1.0, broken=False),
    Crash("every-input", "crash_all", 2.0, broken=True),
]


@pytest.mark.parametrize("case", CRASHES, ids=[c.id for c in CRASHES])
def test_a_worker_killed_by_requests_is_probed_once_restarted(
    server: RunningServer, flags: Path, client: Client, case: Crash
) -> None:
    """Readiness is false while the worker restarts (its rule, docs/reliability.md); asked
    once the worker is back, it says whether the model fails."""
    model = case.model(client.protocol)
    batcher = batcher_of(server, model)
    status, result = _value(client, model, 1.0)
    assert status == "ok", result
    if case.broken:
        (flags / model).touch()
    try:
        for i in range(THRESHOLD):
            status, message = _value(client, model, case.value)
            assert status == FAILED[client.protocol], message
            assert "worker process died" in message, message
            wait_for(batcher, lambda b: b.instances_alive(), "the worker restarted")
            expected = not case.broken or i < THRESHOLD - 1
            assert _ready(client, model) == (expected, expected), f"after {i + 1} crashes"
        assert _probes(server, model) == {
            "passed": 0 if case.broken else 1,
            "failed": 1 if case.broken else 0,
        }
    finally:
        (flags / model).unlink(missing_ok=True)
    status, result = _value(client, model, 3.0)
    assert status == "ok", result
    assert _ready(client, model) == (True, True)
