"""inferd_instance_utilization and inferd_capacity_ratio on a real server, loaded with
Triton's clients over HTTP and gRPC: near 0 idle, near 1 saturated, above 1 overloaded.

Bounds and orderings only: the load is made of a gate the test holds (the instance is busy
for exactly as long as the test wants) and a burst larger than the queue drains at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.batch_statistics import batch_statistics
from tests.support.fault_models import (
    GATED,
    RECORDING_PY,
    blocker_is_executing,
    param,
    write_gated_counter,
    write_model,
)
from tests.support.metrics_scrape import scrape, value
from tests.support.models import write_counter
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import STATE_DEADLINE_S, RunningServer, batcher_of, run_server, wait_for

SLOW = "slow_one_at_a_time"  # max_batch_size 1, 50 ms an execution
BURST = 30


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


@pytest.fixture
def loaded_server(tmp_path: Path, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path / "models"
    write_gated_counter(repo, gate)
    write_model(repo, SLOW, RECORDING_PY, param("delay_ms", 50), max_batch_size=1)
    write_counter(repo, "never_called")
    with run_server(repo) as running:
        yield running


def _signal(server: RunningServer, model: str) -> tuple[float, float]:
    samples = scrape(server)
    assert ("inferd_instance_utilization", frozenset({("model", model)})) in samples
    return (
        value(samples, "inferd_instance_utilization", model=model),
        value(samples, "inferd_capacity_ratio", model=model),
    )


def _send(
    client: Client, server: RunningServer, model: str, x: float, answers: queue.Queue[Any]
) -> None:
    """Send one request without waiting for it; its answer (None, or the error) is put on
    `answers`. HTTP goes through a thread of its own: tritonclient.http's async_infer runs
    on gevent, whose requests only progress while the caller waits on gevent, and the test
    waits on server state with time.sleep."""
    inputs = client.inputs({"IN": (np.full((1, 1), x, np.float32), "FP32")})
    if client.protocol == "grpc":
        client.raw.async_infer(model, inputs, lambda result, error: answers.put(error))
        return
    url = f"127.0.0.1:{server.port}"

    def infer() -> None:
        http = httpclient.InferenceServerClient(url)
        try:
            http.infer(model, inputs)
            answers.put(None)
        except Exception as exc:
            answers.put(exc)
        finally:
            http.close()

    threading.Thread(target=infer, daemon=True).start()


def _all_answered(answers: queue.Queue[Any], n: int) -> None:
    for _ in range(n):
        error = answers.get(timeout=STATE_DEADLINE_S)
        assert error is None, error


def _client(protocol: str, server: RunningServer) -> Client:
    return Client(protocol, server)


def test_an_idle_model_reads_zero(loaded_server: RunningServer) -> None:
    utilization, ratio = _signal(loaded_server, "never_called")
    assert utilization == 0.0 and ratio == 0.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_held_instance_reads_near_one(
    loaded_server: RunningServer, gate: Path, protocol: str
) -> None:
    client = _client(protocol, loaded_server)
    batcher = batcher_of(loaded_server, GATED)
    answers: queue.Queue[Any] = queue.Queue()
    gate.touch()  # closed: the blocker holds the model's one instance
    try:
        _send(client, loaded_server, GATED, -1, answers)
        wait_for(batcher, blocker_is_executing, "the blocker to execute")
        # Busy since just after the first request arrived: the share climbs towards 1.
        deadline = time.monotonic() + STATE_DEADLINE_S
        utilization, ratio = _signal(loaded_server, GATED)
        while utilization < 0.9:
            assert time.monotonic() < deadline, f"utilization stayed at {utilization}"
            wait_for(batcher, blocker_is_executing, "the blocker still executing")
            utilization, ratio = _signal(loaded_server, GATED)
        assert utilization <= 1.0
        assert ratio == pytest.approx(utilization, abs=0.05)  # no cost per row measured yet
    finally:
        gate.unlink()
    _all_answered(answers, 1)
    client.raw.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_burst_beyond_capacity_reads_above_one(
    loaded_server: RunningServer, protocol: str
) -> None:
    """BURST requests at once to a model that executes one at a time: while the queue is
    long, the demand is several times what the instance serves, and it is busy."""
    client = _client(protocol, loaded_server)
    batcher = batcher_of(loaded_server, SLOW)
    answers: queue.Queue[Any] = queue.Queue()
    for i in range(BURST):
        _send(client, loaded_server, SLOW, i + 1, answers)
    wait_for(
        batcher,
        lambda b: (
            batch_statistics(loaded_server, SLOW).executions >= 3 and b.queue_depth() >= BURST // 3
        ),
        "three executions with a third of the burst still queued",
    )
    utilization, ratio = _signal(loaded_server, SLOW)
    _all_answered(answers, BURST)
    assert 0.5 < utilization <= 1.0
    assert ratio > 1.0
    assert ratio > utilization
    idle_utilization, _ = _signal(loaded_server, "never_called")
    assert idle_utilization < utilization
    client.raw.close()
