"""Decoupled requests and the batcher: requests batched together each keep their own stream,
and a request whose client leaves while it is queued never executes."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import STATE_DEADLINE_S, RunningServer, batcher_of, run_server, wait_for
from tests.support.stream_clients import sse_events, stats, wait_for_count
from tests.support.stream_models import write_model

# -- with the batcher: batched together, each on its own stream; leaving the queue --------

# Batched, one instance. Each execution appends its requests' tags to `record_path`; one that
# holds TAG 1 waits while `gate_path` exists (a minute at most), holding the instance so that
# the requests behind it queue up. Each request gets N responses: OUT and BATCH (the number
# of requests its execution held).
BATCHED_PY = """
import json, os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.gate = params["gate_path"]["string_value"]
        self.record = params["record_path"]["string_value"]

    def execute(self, requests):
        def get(request, name):
            return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0, 0])

        tags = [get(r, "TAG") for r in requests]
        if any(tags):  # not the warm-up's zeros
            with open(self.record, "a") as f:
                f.write(" ".join(map(str, tags)) + "\\n")
        give_up = time.monotonic() + 60
        while 1 in tags and os.path.exists(self.gate) and time.monotonic() < give_up:
            threading.Event().wait(0.002)
        for request, tag in zip(requests, tags):
            n = get(request, "N")
            sender = request.get_response_sender()
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([[tag * 1000 + i]], np.int32))
                size = pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32))
                flags = FINAL if i == n - 1 else 0
                sender.send(pb_utils.InferenceResponse([out, size]), flags=flags)
            if n == 0:
                sender.send(flags=FINAL)
        return None
"""

BATCHED_CONFIG = """
name: "repeat_batched"
backend: "python"
max_batch_size: 8
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "TAG", data_type: TYPE_INT32, dims: [ 1 ] }}
]
output [
  {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] }}
]
dynamic_batching {{ }}
parameters {{ key: "gate_path" value: {{ string_value: "{gate}" }} }}
parameters {{ key: "record_path" value: {{ string_value: "{record}" }} }}
"""


@dataclass
class Batched:
    server: RunningServer
    gate: Path
    record: Path

    def executions(self) -> list[list[int]]:
        if not self.record.exists():
            return []
        return [[int(t) for t in line.split()] for line in self.record.read_text().splitlines()]

    def stream(self, tag: int, n: int, into: dict[int, list[dict[str, Any]]]) -> None:
        with (
            self.server.client() as client,
            client.stream(
                "POST", "/v2/models/repeat_batched/generate_stream", json={"N": n, "TAG": tag}
            ) as r,
        ):
            into[tag] = list(sse_events(r.iter_lines()))

    def hold(self) -> tuple[threading.Thread, dict[int, list[dict[str, Any]]]]:
        """The instance busy with TAG 1, behind the gate, until the gate is removed."""
        self.gate.touch()
        self.record.unlink(missing_ok=True)
        held: dict[int, list[dict[str, Any]]] = {}
        blocker = threading.Thread(target=self.stream, args=(1, 1, held))
        blocker.start()
        deadline = time.monotonic() + STATE_DEADLINE_S
        while self.executions() != [[1]]:
            assert time.monotonic() < deadline, "the blocker did not start executing"
            time.sleep(0.002)
        return blocker, held


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Batched]:
    repo = tmp_path_factory.mktemp("batched_repo")
    state = tmp_path_factory.mktemp("batched_state")
    gate, record = state / "gate", state / "record"
    write_model(repo, "repeat_batched", BATCHED_PY, BATCHED_CONFIG.format(gate=gate, record=record))
    with run_server(repo) as running:
        yield Batched(running, gate, record)
        gate.unlink(missing_ok=True)


def test_requests_batched_together_each_get_their_own_stream(batched: Batched) -> None:
    blocker, results = batched.hold()
    threads = [threading.Thread(target=batched.stream, args=(tag, 3, results)) for tag in (2, 3, 4)]
    for t in threads:
        t.start()
    wait_for(batcher_of(batched.server, "repeat_batched"), lambda b: b.queue_depth() == 3, "3")
    batched.gate.unlink()
    for t in [blocker, *threads]:
        t.join(STATE_DEADLINE_S)
    # The three queued ones (in whichever order they arrived): one execution.
    assert [sorted(tags) for tags in batched.executions()] == [[1], [2, 3, 4]]
    for tag in (2, 3, 4):
        assert [(e["OUT"], e["BATCH"]) for e in results[tag]] == [
            (tag * 1000 + i, 3) for i in range(3)
        ]


def test_a_request_whose_client_leaves_the_queue_never_executes(batched: Batched) -> None:
    blocker, _ = batched.hold()
    failed_before = stats(batched.server, "repeat_batched")["inference_stats"]["fail"]["count"]
    body = json.dumps({"N": 1, "TAG": 5}).encode()
    with socket.create_connection(("127.0.0.1", batched.server.port)) as sock:
        sock.sendall(
            b"POST /v2/models/repeat_batched/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_for(
            batcher_of(batched.server, "repeat_batched"), lambda b: b.queue_depth() == 1, "queued"
        )
    # Gone while queued: counted at once (cancelled), while the blocker still runs...
    doc = wait_for_count(batched.server, "repeat_batched", "fail", failed_before + 1)
    assert doc["inference_stats"]["fail"]["count"] == failed_before + 1
    assert blocker.is_alive()
    batched.gate.unlink()
    blocker.join(STATE_DEADLINE_S)
    # ...and it never reaches the model: the next request runs alone, right after the blocker.
    later: dict[int, list[dict[str, Any]]] = {}
    batched.stream(6, 1, later)
    assert [e["OUT"] for e in later[6]] == [6000]
    assert batched.executions() == [[1], [6]]
