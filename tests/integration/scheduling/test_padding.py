"""Padding to the batch's longest member end to end (pad_inputs, docs/batching.md#padding),
over HTTP and gRPC with tritonclient: requests of different lengths share executions, grouped
by length, and each gets its own answer, its padded outputs cut back to its own length."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inferd.scheduling.batcher import DynamicBatcher
from tests.support.fault_models import blocker_is_executing
from tests.support.metrics_scrape import scrape, value
from tests.support.padding_models import (
    PAD_ONNX,
    PAD_PY,
    PAD_TRITON_PY,
    tokens,
    write_padding_models,
)
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, batcher_of, run_server, wait_for


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """While this file exists, the gated model holds its blocker."""
    return tmp_path_factory.mktemp("padding_gate") / "closed"


@pytest.fixture(scope="module")
def padding_server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("padding_repo")
    write_padding_models(repo, gate)
    with run_server(repo) as running:
        yield running


def infer(protocol: str, server: RunningServer, model: str, length: int, start: int = 1) -> Any:
    client = Client(protocol, server)  # one client per thread
    try:
        ids, mask = tokens(length, start)
        return client.infer(model, {"ids": (ids, "INT64"), "mask": (mask, "INT64")})
    finally:
        client.raw.close()


def padding_stats(protocol: str, server: RunningServer, model: str) -> dict[str, int]:
    client = Client("http", server)  # inferd's own field: HTTP's JSON (gRPC's message has none)
    try:
        doc: Any = client.raw.get_inference_statistics(model)
    finally:
        client.raw.close()
    (stats,) = doc["model_stats"]
    return dict(stats["padding"])


LENGTHS = (3, 30, 4, 29, 5)  # queued in this order behind the blocker


def depth_is(count: int) -> Callable[[DynamicBatcher], bool]:
    return lambda batcher: batcher.queue_depth() == count


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_queued_requests_leave_grouped_by_length(
    padding_server: RunningServer, gate: Path, protocol: str
) -> None:
    batcher = batcher_of(padding_server, PAD_PY)
    samples = scrape(padding_server)
    closes = {
        r: value(samples, "inferd_batch_close_total", model=PAD_PY, version="1", reason=r)
        for r in ("length", "queue_empty")
    }
    stats_before = padding_stats(protocol, padding_server, PAD_PY)
    with ThreadPoolExecutor(len(LENGTHS) + 1) as pool:
        gate.touch()  # closed: the blocker holds the instance
        try:
            blocker = pool.submit(infer, protocol, padding_server, PAD_PY, 1, -1)
            wait_for(batcher, blocker_is_executing, "the blocker to execute")
            futures = []
            for queued, n in enumerate(LENGTHS, 1):  # one at a time: the queue's order is ours
                futures.append(pool.submit(infer, protocol, padding_server, PAD_PY, n))
                wait_for(batcher, depth_is(queued), f"{queued} queued")
        finally:
            gate.unlink(missing_ok=True)  # open, even when failing
        blocker.result(timeout=60)
        results = [f.result(timeout=60) for f in futures]

    for n, result in zip(LENGTHS, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("hidden"), 2 * tokens(n)[0])  # cut back
        assert int(result.as_numpy("REAL")[0, 0]) == n
    width = {n: int(r.as_numpy("WIDTH")[0, 0]) for n, r in zip(LENGTHS, results, strict=True)}
    execs = {n: int(r.as_numpy("EXEC")[0, 0]) for n, r in zip(LENGTHS, results, strict=True)}
    # The oldest (3) left with the lengths nearest it, 4 and 5, padded to 5; the next
    # nearest, 29, would have padded that batch past 25%: the long ones left together.
    assert width == {3: 5, 4: 5, 5: 5, 29: 30, 30: 30}
    assert execs[3] == execs[4] == execs[5] != execs[29] == execs[30]

    samples = scrape(padding_server)
    after = {
        r: value(samples, "inferd_batch_close_total", model=PAD_PY, version="1", reason=r)
        for r in ("length", "queue_empty")
    }
    assert after["length"] - closes["length"] == 1
    assert after["queue_empty"] - closes["queue_empty"] == 2  # the blocker and the long pair
    stats = padding_stats(protocol, padding_server, PAD_PY)
    # ids and mask: the blocker (1 of 1), 3 + 4 + 5 padded to 3 x 5, 29 + 30 to 2 x 30.
    real = 2 * (1 + 3 + 4 + 5 + 29 + 30)
    padded = 2 * (1 + 15 + 60)
    assert stats["batches"] - stats_before["batches"] == 3
    assert stats["real_elements"] - stats_before["real_elements"] == real
    assert stats["padded_elements"] - stats_before["padded_elements"] == padded
    assert value(samples, "inferd_batch_padded_elements_total", model=PAD_PY, version="1") >= padded
    assert value(samples, "inferd_batch_real_elements_total", model=PAD_PY, version="1") >= real


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_concurrent_requests_of_any_length_get_their_own_answers(
    padding_server: RunningServer, protocol: str
) -> None:
    rng = np.random.default_rng(32)
    lengths = [int(n) for n in rng.integers(1, 40, size=48)]
    with ThreadPoolExecutor(16) as pool:
        futures = [
            pool.submit(infer, protocol, padding_server, PAD_ONNX, n, start=k)
            for k, n in enumerate(lengths)
        ]
        results = [f.result(timeout=60) for f in futures]
    for k, (n, result) in enumerate(zip(lengths, results, strict=True)):
        ids = tokens(n, start=k)[0]
        np.testing.assert_allclose(result.as_numpy("mean"), [[ids.mean()]], rtol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("hidden"), 2 * ids)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_padded_inputs_of_different_lengths_in_one_request_are_refused(
    padding_server: RunningServer, protocol: str
) -> None:
    client = Client(protocol, padding_server)
    ids, _ = tokens(4)
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            PAD_ONNX, {"ids": (ids, "INT64"), "mask": (np.ones((1, 5), np.int64), "INT64")}
        )
    client.raw.close()
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    message = info.value.message()
    assert "input 'mask' holds 5 in its padded dimension and input 'ids' 4" in message
    assert "pad_inputs" in message
    assert batcher_of(padding_server, PAD_ONNX).inflight() == 0


def test_a_model_that_sees_requests_apart_is_refused_at_load(padding_server: RunningServer) -> None:
    for ready in (PAD_ONNX, PAD_PY):  # warmed up through the padding merge, cleanly
        served = padding_server.server.registry.get(ready)
        assert served.is_ready and served.warning == "", (ready, served.warning)
    model = padding_server.server.registry.models[PAD_TRITON_PY]
    (version,) = model.versions.values()
    assert not version.is_ready
    assert version.reason.startswith(
        f"load failed: {PAD_TRITON_PY}/config.pbtxt: parameters.pad_inputs: "
    )
    assert "execute(requests)" in version.reason
