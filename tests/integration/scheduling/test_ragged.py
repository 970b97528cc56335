"""Ragged batching end to end, over HTTP and gRPC with tritonclient: requests whose ragged
input has different lengths are served by one execution, each answered with its own sum."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.support.fault_models import blocker_is_executing
from tests.support.metrics_scrape import scrape, value
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.ragged_models import (
    RAGGED_ONNX,
    RAGGED_ONNX_WINDOW,
    RAGGED_PY,
    RAGGED_TRITON_PY,
    write_ragged_models,
)
from tests.support.servers import RunningServer, batcher_of, run_server, wait_for

LENGTHS = (3, 5, 7, 9)


@pytest.fixture(scope="module")
def ragged_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """While this file exists, the gated Python models hold their blocker."""
    return tmp_path_factory.mktemp("ragged_gate") / "closed"


@pytest.fixture(scope="module")
def ragged_server(
    tmp_path_factory: pytest.TempPathFactory, ragged_gate: Path
) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("ragged_repo")
    write_ragged_models(repo, ragged_gate)
    with run_server(repo) as running:
        yield running


CLOSE = "inferd_batch_close_total"


def _stats(client: Client, model: str) -> tuple[int, int, int]:
    """(executions, inferences, executions of a batch of 4 rows) from Triton's statistics."""
    kwargs = {"as_json": True} if client.protocol == "grpc" else {}
    doc: Any = client.raw.get_inference_statistics(model, **kwargs)
    (stats,) = doc["model_stats"]
    # gRPC's JSON writes 64-bit counts as strings, HTTP's as numbers.
    of_four = [b for b in stats.get("batch_stats", []) if int(b["batch_size"]) == 4]
    four = int(of_four[0]["compute_infer"]["count"]) if of_four else 0
    return int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0)), four


# (model, how its four requests are kept together until all are queued): the Python models
# hold a blocker at a gate; the ONNX model's window waits for its preferred batch size, 4.
ONE_EXECUTION = [
    (RAGGED_ONNX_WINDOW, "window"),
    (RAGGED_PY, "gate"),
    (RAGGED_TRITON_PY, "gate"),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "hold"), ONE_EXECUTION, ids=[m for m, _ in ONE_EXECUTION])
def test_four_ragged_requests_are_one_execution(
    ragged_server: RunningServer, ragged_gate: Path, model: str, hold: str, protocol: str
) -> None:
    values = [(k + 1) * np.arange(1, n + 1, dtype=np.float32)[None] for k, n in enumerate(LENGTHS)]
    batcher = batcher_of(ragged_server, model)
    stats_client = Client(protocol, ragged_server)
    before = _stats(stats_client, model)
    closes_before = value(
        scrape(ragged_server), CLOSE, model=model, version="1", reason="preferred_size"
    )

    def infer(x: np.ndarray, request_id: str) -> Any:
        client = Client(protocol, ragged_server)  # one client per thread
        try:
            return client.infer(model, {"INPUT": (x, "FP32")}, request_id=request_id)
        finally:
            client.raw.close()

    blockers = 0
    with ThreadPoolExecutor(len(LENGTHS) + 1) as pool:
        if hold == "gate":
            ragged_gate.touch()  # closed: the blocker will hold the instance
            try:
                blocker = pool.submit(infer, np.full((1, 1), -1, np.float32), "blocker")
                wait_for(batcher, blocker_is_executing, "the blocker to execute")
                futures = [pool.submit(infer, x, str(k)) for k, x in enumerate(values)]
                wait_for(batcher, lambda b: b.queue_depth() == 4, "4 queued requests")
            finally:
                ragged_gate.unlink(missing_ok=True)  # open, even when failing
            blocker.result(timeout=60)
            blockers = 1
        else:
            futures = [pool.submit(infer, x, str(k)) for k, x in enumerate(values)]
        results = [f.result(timeout=60) for f in futures]
    after = _stats(stats_client, model)
    stats_client.raw.close()

    for x, result in zip(values, results, strict=True):  # each its own sum: (k+1)*n*(n+1)/2
        np.testing.assert_array_equal(result.as_numpy("SUM"), [[x.sum()]])
    executions = after[0] - before[0] - blockers
    assert executions == 1, f"4 ragged requests ran as {executions} executions"
    assert after[1] - before[1] - blockers == 4
    assert after[2] - before[2] == 1  # the one execution was a batch of 4 rows
    if model == RAGGED_ONNX_WINDOW:
        closes = value(
            scrape(ragged_server), CLOSE, model=model, version="1", reason="preferred_size"
        )
        assert closes - closes_before == 1  # the window left at its preferred size
    else:
        assert len({int(r.as_numpy("EXEC")[0, 0]) for r in results}) == 1
        seen = [int(r.as_numpy("SEEN")[0, 0]) for r in results]
        # inferd's Model gets the merged batch: one flat INPUT of 3 + 5 + 7 + 9 values; a
        # TritonPythonModel gets each request's own tensor, as in Triton's Python backend.
        assert seen == ([sum(LENGTHS)] * 4 if model == RAGGED_PY else list(LENGTHS))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", [RAGGED_ONNX, RAGGED_PY, RAGGED_TRITON_PY])
def test_a_lone_ragged_request(ragged_server: RunningServer, model: str, protocol: str) -> None:
    # Alone in its batch, the input is still flattened and the batch input still computed.
    client = Client(protocol, ragged_server)
    x = np.linspace(0.5, 3.0, 6, dtype=np.float32)[None]
    result = client.infer(model, {"INPUT": (x, "FP32")})
    client.raw.close()
    np.testing.assert_allclose(result.as_numpy("SUM"), [[x.sum()]], rtol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_cannot_send_the_batch_input(ragged_server: RunningServer, protocol: str) -> None:
    client = Client(protocol, ragged_server)
    tensors = {
        "INPUT": (np.ones((1, 3), np.float32), "FP32"),
        "INDEX": (np.array([3], np.int32), "INT32"),
    }
    with pytest.raises(InferenceServerException) as info:
        client.infer(RAGGED_ONNX, tensors)
    client.raw.close()
    status = info.value.status()
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), status
    message = info.value.message()
    assert "input 'INDEX' is a batch input (BATCH_ACCUMULATED_ELEMENT_COUNT of 'INPUT')" in message
    assert "the server supplies it" in message


@pytest.mark.parametrize("model", [RAGGED_ONNX, RAGGED_ONNX_WINDOW, RAGGED_PY])
def test_ragged_models_warm_up_through_the_merge_step(
    ragged_server: RunningServer, model: str
) -> None:
    # The automatic warm-up (batch 1, and 4 for the window model's preferred size) feeds the
    # model flat inputs and batch inputs: a model that takes only those warms up cleanly.
    version = ragged_server.server.registry.get(model)
    assert version.is_ready
    assert version.warning == ""
