"""What a decoupled model must do, and what inferd does when it does not: a sender let go
without the final flag, sends after it, responses returned from execute, configurations that
cannot run decoupled, and the circuit breaker over streams."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import STATE_DEADLINE_S, RunningServer, run_server
from tests.support.stream_clients import sse_events, stats, wait_for_count
from tests.support.stream_models import ISOLATED, REPEAT_CONFIG, REPEAT_INFERD_PY, write_model

# -- what a decoupled model must do -----------------------------------------------------------

NO_FINAL_PY = """
import triton_python_backend_utils as pb_utils
import numpy as np

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if x[0] == 1:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
            elif x[0] == 2:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif x[0] == 3:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)])]
        return None
"""

NO_FINAL_CONFIG = """
name: "careless"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
parameters { key: "auto_warmup" value: { string_value: "false" } }
"""


@pytest.fixture(scope="module")
def warnings() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[assignment, method-assign]
    logger = logging.getLogger("inferd.backends.python")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def careless(
    tmp_path_factory: pytest.TempPathFactory, warnings: list[logging.LogRecord]
) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("careless_repo")
    write_model(repo, "careless", NO_FINAL_PY, NO_FINAL_CONFIG)
    with run_server(repo) as running:
        yield running


def careless_events(server: RunningServer, value: float) -> list[dict[str, Any]]:
    with (
        server.client() as client,
        client.stream("POST", "/v2/models/careless/generate_stream", json={"IN": value}) as r,
    ):
        if r.status_code != 200:
            return [{"status": r.status_code, **json.loads(r.read())}]
        return list(sse_events(r.iter_lines()))


def test_a_model_that_drops_its_sender_without_the_final_flag(careless: RunningServer) -> None:
    # The client is not left waiting: the stream ends with an error naming the mistake.
    events = careless_events(careless, 1)
    assert events[0]["OUT"] == 1
    assert (
        "released the request's response sender without sending the final flag"
        in (events[1]["error"])
    )
    nothing = careless_events(careless, 0)
    assert nothing[0]["status"] == 500
    assert "without sending the final flag" in nothing[0]["error"]


def test_a_decoupled_model_breaking_the_contract_fails_loudly(
    careless: RunningServer, warnings: list[logging.LogRecord]
) -> None:
    # Sending after the final flag raises in the model (Triton's message): the client had
    # its stream's end already, so the log says what went wrong.
    assert careless_events(careless, 2) == []
    assert_warned(warnings, "Unable to send response. Response sender has been closed.")
    # Returning responses from execute: refused, after the one response it sent.
    returned = careless_events(careless, 3)
    assert returned == [{"model_name": "careless", "model_version": "1", "OUT": 3.0}]
    assert_warned(warnings, "execute() returned list; a decoupled model")
    with careless.client() as client:
        assert client.get("/v2/health/ready").status_code == 200


def assert_warned(records: list[logging.LogRecord], words: str) -> None:
    """The warning is logged in the model's thread, which may end after the client's read."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not any(words in r.getMessage() for r in records):
        assert time.monotonic() < deadline, f"no warning with {words!r}"
        time.sleep(0.005)


def test_a_decoupled_model_without_predict_stream_fails_the_load(tmp_path: Path) -> None:
    code = "class Model:\n    def predict(self, inputs): ...\n"
    for name, extra in (("no_stream", ""), ("no_stream_isolated", ISOLATED)):
        write_model(tmp_path, name, code, REPEAT_CONFIG.format(name=name, marker_dir=tmp_path))
        (tmp_path / name / "config.pbtxt").write_text(
            (tmp_path / name / "config.pbtxt").read_text() + extra
        )
    with run_server(tmp_path) as running, running.client() as client:
        index = {row["name"]: row for row in client.post("/v2/repository/index").json()}
    for name in ("no_stream", "no_stream_isolated"):  # in the server, and in a worker process
        assert index[name]["state"] == "UNAVAILABLE"
        assert "must define Model.predict_stream(inputs, responses)" in index[name]["reason"]


def test_a_failing_decoupled_model_opens_its_circuit_and_a_good_probe_closes_it(
    tmp_path: Path,
) -> None:
    config = REPEAT_CONFIG.format(name="fragile", marker_dir=tmp_path) + (
        'parameters { key: "circuit_breaker_failures" value: { string_value: "2" } }\n'
        'parameters { key: "circuit_breaker_open_s" value: { string_value: "0.2" } }\n'
    )
    write_model(tmp_path, "fragile", REPEAT_INFERD_PY, config)
    with run_server(tmp_path) as running, running.client() as client:
        circuit = running.server.registry.models["fragile"].circuit
        url = "/v2/models/fragile/generate_stream"
        for failures in (1, 2):
            r = client.post(url, json={"N": 2, "TAG": 1, "RAISE_AT": 0})
            assert r.status_code == 500
            wait_for_count(running, "fragile", "fail", failures)  # the outcome is counted
        assert circuit.is_open
        refused = client.post(url, json={"N": 1, "TAG": 1})
        assert refused.status_code == 503 and "circuit is open" in refused.json()["error"]
        deadline = time.monotonic() + STATE_DEADLINE_S
        while circuit.retry_in_s() > 0:  # the breaker's own clock: a probe is due
            assert time.monotonic() < deadline
            time.sleep(0.005)
        probe = client.post(url, json={"N": 2, "TAG": 1})
        assert probe.status_code == 200
        assert [e["OUT"] for e in sse_events(iter(probe.text.splitlines()))] == [1000, 1001]
        wait_for_count(running, "fragile", "success", 1)
        assert not circuit.is_open  # a successful stream closed it


def test_an_open_decoupled_circuit_streams_from_its_fallback_counted_there(
    tmp_path: Path,
) -> None:
    config = REPEAT_CONFIG.format(name="fragile", marker_dir=tmp_path) + (
        'parameters { key: "circuit_breaker_failures" value: { string_value: "2" } }\n'
        'parameters { key: "circuit_breaker_open_s" value: { string_value: "600" } }\n'
        'parameters { key: "fallback_model" value: { string_value: "spare" } }\n'
    )
    write_model(tmp_path, "fragile", REPEAT_INFERD_PY, config)
    spare = REPEAT_CONFIG.format(name="spare", marker_dir=tmp_path)
    write_model(tmp_path, "spare", REPEAT_INFERD_PY, spare)
    with run_server(tmp_path) as running, running.client() as client:
        url = "/v2/models/fragile/generate_stream"
        for failures in (1, 2):
            assert client.post(url, json={"N": 2, "TAG": 1, "RAISE_AT": 0}).status_code == 500
            wait_for_count(running, "fragile", "fail", failures)
        assert running.server.registry.models["fragile"].circuit.is_open
        served = client.post(url, json={"N": 2, "TAG": 1})
        assert served.status_code == 200
        events = sse_events(iter(served.text.splitlines()))
        assert [(e["model_name"], e["OUT"], e["fallback_from"]) for e in events] == [
            ("spare", 1000, "fragile"),
            ("spare", 1001, "fragile"),
        ]
        # Counted once, as the fallback model's request; the primary's counts are unchanged.
        wait_for_count(running, "spare", "success", 1)
        primary = stats(running, "fragile")["inference_stats"]
        assert (primary["success"]["count"], primary["fail"]["count"]) == (0, 2)
        assert stats(running, "spare")["inference_stats"]["fail"]["count"] == 0
