"""Load failures as an operator meets them: caught at load, not at the first request, and
reported in the repository index (over HTTP and gRPC) with the file and field to fix; the
index always shows the latest attempt's reason."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import (
    PY_CONFIG,
    WARM_COUNTING_PY,
    write_plus_model,
    write_python_model,
)
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server
from tests.support.warmup_models import MISNAMED_PY, POISONED_PY, index_row

ONE = {"IN": (np.ones((1, 1), np.float32), "FP32")}


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("broken_repo")
    # y = x + 1 takes x: FP32 [batch, 4]; the config says 5 (ONNX Runtime would only say
    # "Got invalid dimensions" at the first run).
    _plus_model(
        repo,
        "wide",
        '"x", data_type: TYPE_FP32, dims: [ 4 ]',
        '"x", data_type: TYPE_FP32, dims: [ 5 ]',
    )
    _plus_model(repo, "tensorflow", "onnxruntime_onnx", "tensorflow_savedmodel")
    _plus_model(repo, "tensorrt", 'platform: "onnxruntime_onnx"', 'backend: "tensorrt"')
    # A Python model with no config.pbtxt at all.
    (repo / "bare" / "1").mkdir(parents=True)
    (repo / "bare" / "1" / "model.py").write_text(MISNAMED_PY)
    with run_server(repo) as running:
        yield running


def _plus_model(repo: Path, name: str, old: str, new: str) -> None:
    """tests.support.lifecycle_models' y = x + 1 model, with `old` replaced by `new` in its
    config."""
    write_plus_model(repo, name, [1])
    config = repo / name / "config.pbtxt"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, broken_server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, broken_server)
    yield c
    c.raw.close()


# (model, words its index reason must hold)
LOAD_ERRORS = [
    (
        "wide",
        [
            "wide/config.pbtxt: input 'x': dims [5] do not match the model file's shape [-1, 4]",
            "dimension 0 after the batch dimension (max_batch_size 8) is 4 in the model file",
        ],
    ),
    (
        "tensorflow",
        [
            "tensorflow/config.pbtxt: platform 'tensorflow_savedmodel' is not supported",
            "supported platforms: onnxruntime_onnx, pytorch_libtorch",
            "onnxruntime, pytorch, python",
        ],
    ),
    (
        "tensorrt",
        [
            "tensorrt/config.pbtxt: backend: unknown backend 'tensorrt'",
            "supported backends: onnxruntime, pytorch, python",
        ],
    ),
    (
        "bare",
        [
            "bare: no config.pbtxt, and bare/1/model.py does not say which tensors",
            'add bare/config.pbtxt declaring them, e.g. backend: "python"',
            "input [",
            "output [",
        ],
    ),
]


@pytest.mark.parametrize(("model", "words"), LOAD_ERRORS, ids=[c[0] for c in LOAD_ERRORS])
def test_load_error_names_what_to_fix(client: Client, model: str, words: list[str]) -> None:
    row = index_row(client, model)
    assert row["state"] == "UNAVAILABLE"
    for w in words:
        assert w in row["reason"]
    assert "invalid dimensions" not in row["reason"]
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, {"x": (np.ones((1, 4), np.float32), "FP32")})
    assert words[0] in str(info.value.message())


# -- poll mode: the index shows the latest attempt's reason ---------------------------------


def _replace(path: Path, text: str, staging: Path) -> None:
    """Write `path` whole (through a rename), so a poll never reads half of it."""
    tmp = staging / path.name
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_for_row(
    clients: list[Client], model: str, condition: Callable[[dict[str, Any]], bool], what: str
) -> list[dict[str, Any]]:
    """Poll the index over every client until each one's row meets `condition`."""
    deadline = time.monotonic() + 30
    while True:
        rows = [index_row(c, model) for c in clients]
        if all(condition(r) for r in rows):
            return rows
        assert time.monotonic() < deadline, f"{what} never showed in the index: {rows}"
        time.sleep(0.02)


def test_poll_mode_index_shows_the_latest_failure(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    staging = tmp_path / "staging"
    staging.mkdir()
    warmup = """
        model_warmup [ {{
          name: "{name}"
          batch_size: 1
          inputs {{ key: "IN" value: {{ data_type: TYPE_FP32, dims: [ 1 ], zero_data: true }} }}
        }} ]
    """
    write_python_model(repo, "flip", POISONED_PY, extra=warmup.format(name="zeros"))
    config = repo / "flip" / "config.pbtxt"
    with run_server(repo, model_control_mode="poll", repository_poll_s=0.05) as server:
        clients = [Client(p, server) for p in PROTOCOLS]
        try:
            # 1. A configured warm-up fails.
            _wait_for_row(
                clients,
                "flip",
                lambda r: "warm-up 'zeros' failed" in r.get("reason", ""),
                "the warm-up failure",
            )

            # 2. Then the config breaks: its error replaces the warm-up's.
            _replace(
                config,
                config.read_text().replace("max_batch_size: 8", "max_batch_size: -1"),
                staging,
            )
            rows = _wait_for_row(
                clients,
                "flip",
                lambda r: "max_batch_size must be >= 0" in r.get("reason", ""),
                "the config error",
            )
            for row in rows:
                assert row["state"] == "UNAVAILABLE"
                assert "flip/config.pbtxt" in row["reason"]
                assert "warm-up" not in row["reason"]
            for c in clients:
                with pytest.raises(InferenceServerException) as info:
                    c.infer("flip", ONE)
                assert "max_batch_size must be >= 0" in str(info.value.message())

            # 3. The config is fixed, but another configured warm-up fails: the config error
            # is history.
            _replace(
                config,
                PY_CONFIG.format(name="flip", extra=warmup.format(name="zeros again")),
                staging,
            )
            rows = _wait_for_row(
                clients,
                "flip",
                lambda r: "warm-up 'zeros again' failed" in r.get("reason", ""),
                "the second warm-up failure",
            )
            for row in rows:
                assert "max_batch_size" not in row["reason"]
            for c in clients:
                with pytest.raises(InferenceServerException) as info:
                    c.infer("flip", ONE)
                assert "zeros again" in str(info.value.message())
                assert "max_batch_size" not in str(info.value.message())

            # 4. Fixed for good: READY, and no reason left over.
            _replace(repo / "flip" / "1" / "model.py", WARM_COUNTING_PY, staging)
            _replace(config, PY_CONFIG.format(name="flip", extra=""), staging)
            rows = _wait_for_row(clients, "flip", lambda r: r["state"] == "READY", "READY")
            assert all(not r.get("reason") for r in rows), rows
            for c in clients:
                assert c.infer("flip", ONE).as_numpy("OUT").shape == (1, 1)
        finally:
            for c in clients:
                c.raw.close()


def test_poll_mode_reason_clears_when_the_files_are_restored(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    staging = tmp_path / "staging"
    staging.mkdir()
    write_python_model(repo, "steady", WARM_COUNTING_PY)
    code = repo / "steady" / "1" / "model.py"
    with run_server(repo, model_control_mode="poll", repository_poll_s=0.05) as server:
        clients = [Client(p, server) for p in PROTOCOLS]
        try:
            _wait_for_row(clients, "steady", lambda r: r["state"] == "READY", "READY")
            # A broken replacement never replaces the working version; it says why.
            _replace(code, "raise RuntimeError('broken on import')\n", staging)
            rows = _wait_for_row(
                clients,
                "steady",
                lambda r: "broken on import" in r.get("reason", ""),
                "the failure",
            )
            assert all(r["state"] == "READY" for r in rows)
            assert all("still serving the loaded files" in r["reason"] for r in rows)
            # The same files as the serving version again: nothing is wrong any more.
            _replace(code, WARM_COUNTING_PY, staging)
            rows = _wait_for_row(clients, "steady", lambda r: not r.get("reason"), "no reason")
            assert all(r["state"] == "READY" for r in rows)
        finally:
            for c in clients:
                c.raw.close()
