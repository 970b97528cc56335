"""PyTorch models (TorchScript and torch.export) over HTTP and gRPC, with batching."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.support.batch_statistics import batch_statistics
from tests.support.models import builders
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server
from tests.support.torch_models import build_torch_repository


@pytest.fixture(scope="module")
def torch_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, list[logging.LogRecord]]]:
    repo = tmp_path_factory.mktemp("torch_repo")
    build_torch_repository(repo, builders)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[assignment, method-assign]
    logger = logging.getLogger("inferd.backends.torch")
    logger.addHandler(handler)
    try:
        with run_server(repo) as running:
            yield running, records
    finally:
        logger.removeHandler(handler)


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, torch_server) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    c = Client(request.param, torch_server[0])
    yield c
    c.raw.close()


def test_torchscript_by_argument_name(client: Client, torch_server) -> None:  # type: ignore[no-untyped-def]
    repo = torch_server[0].server.settings.model_repository
    module = torch.jit.load(str(repo / "ts_mlp" / "1" / "model.pt"))
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    expected_p, expected_label = module(torch.from_numpy(x))
    result = client.infer("ts_mlp", {"input": (x, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("probabilities"), expected_p.detach().numpy())
    np.testing.assert_array_equal(result.as_numpy("label"), expected_label.numpy())


def test_triton_index_convention(client: Client) -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.full((2, 3), 10, dtype=np.int32)
    result = client.infer("ts_indexed", {"INPUT__0": (a, "INT32"), "INPUT__1": (b, "INT32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


@pytest.mark.parametrize("model", ["exported", "compiled"])
def test_exported_program(client: Client, model: str) -> None:
    x = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    result = client.infer(model, {"x": (x, "FP32")})
    np.testing.assert_allclose(result.as_numpy("y"), np.maximum(x, 0) * 3, rtol=1e-6)


def test_concurrent_requests_are_batched_and_split_back(torch_server) -> None:  # type: ignore[no-untyped-def]
    running: RunningServer = torch_server[0]
    before = batch_statistics(running, "exported")

    def one(i: int) -> np.ndarray:
        c = Client("http", running)
        try:
            x = np.full((1, 5), float(i), dtype=np.float32)
            return c.infer("exported", {"x": (x, "FP32")}).as_numpy("y")
        finally:
            c.raw.close()

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(96)))
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, np.full((1, 5), 3.0 * i))
    batches = batch_statistics(running, "exported") - before
    assert batches.inferences == 96  # one row each
    assert batches.executions < 96, "no two requests were ever merged"


def test_pickled_module_is_refused(torch_server) -> None:  # type: ignore[no-untyped-def]
    with torch_server[0].client() as c:
        rows = c.post("/v2/repository/index").json()
    row = next(r for r in rows if r["name"] == "pickled")
    assert row["state"] == "UNAVAILABLE"
    assert "not a TorchScript archive" in row["reason"]


def test_gpu_kind_falls_back_loudly(client: Client, torch_server) -> None:  # type: ignore[no-untyped-def]
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the fallback path does not apply")
    records = torch_server[1]
    assert any("KIND_GPU" in r.getMessage() and "wants_gpu" in r.getMessage() for r in records)
    x = np.array([[-1.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(
        client.infer("wants_gpu", {"x": (x, "FP32")}).as_numpy("y"), [[0.0, 6.0]]
    )
