"""Warm-up runs before a version is READY. A configured warm-up that fails, or outputs that
contradict the config, keep the version out of service; an automatic warm-up the model
refuses (it does not take zeros) is a warning, and the version serves."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import WARM_COUNTING_PY, write_python_model
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server
from tests.support.warmup_models import (
    MISNAMED_PY,
    NO_AUTO_WARMUP,
    NONCONFORMING,
    POISONED_PY,
    ZERO_WARMUP,
    index_row,
)


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("warm_repo")
    write_python_model(
        repo,
        "configured",
        WARM_COUNTING_PY,
        extra="""
        model_warmup [ {
          name: "two zero batches of 3"
          batch_size: 3
          inputs { key: "IN" value: { data_type: TYPE_FP32, dims: [ 1 ], zero_data: true } }
          count: 2
        } ]
        """,
    )
    write_python_model(
        repo,
        "automatic",
        WARM_COUNTING_PY,
        extra="dynamic_batching { preferred_batch_size: [ 2, 4 ] }",
    )
    write_python_model(
        repo,
        "no_warmup",
        WARM_COUNTING_PY,
        extra=NO_AUTO_WARMUP,
    )
    write_python_model(repo, "poisoned", POISONED_PY)
    write_python_model(repo, "poisoned_configured", POISONED_PY, extra=ZERO_WARMUP)
    for name, (code, _) in NONCONFORMING.items():
        write_python_model(repo, name, code)
    write_python_model(repo, "misnamed_configured", MISNAMED_PY, extra=ZERO_WARMUP)
    write_python_model(repo, "misnamed_unwarmed", MISNAMED_PY, extra=NO_AUTO_WARMUP)
    with run_server(repo) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, warm_server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, warm_server)
    yield c
    c.raw.close()


BODY = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}


def _first_answer(server: RunningServer, model: str) -> float:
    with server.client() as c:
        r = c.post(f"/v2/models/{model}/infer", json=BODY)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


def test_configured_warmup_ran_before_the_first_request(warm_server: RunningServer) -> None:
    assert _first_answer(warm_server, "configured") == 2  # count 2


def test_automatic_warmup_at_each_preferred_size(warm_server: RunningServer) -> None:
    assert _first_answer(warm_server, "automatic") == 3  # batch 1, 2 and 4


def test_warmup_can_be_turned_off(warm_server: RunningServer) -> None:
    assert _first_answer(warm_server, "no_warmup") == 0


def test_automatic_warmup_the_model_refuses_is_a_warning(client: Client) -> None:
    row = index_row(client, "poisoned")
    assert row["state"] == "READY"
    assert client.raw.is_model_ready("poisoned")
    # The failure stays visible on the serving version, with what to do about it.
    assert "automatic warm-up failed, serving without it" in row["reason"]
    assert "warm-up 'auto batch 1' failed: zeros are poison" in row["reason"]
    assert "poisoned/config.pbtxt a model_warmup section" in row["reason"]
    result = client.infer("poisoned", {"IN": (np.ones((1, 1), np.float32), "FP32")})
    assert result.as_numpy("OUT").shape == (1, 1)


def test_configured_warmup_that_fails_fails_the_load(client: Client) -> None:
    row = index_row(client, "poisoned_configured")
    assert row["state"] == "UNAVAILABLE"
    assert "warm-up 'zeros' failed: zeros are poison" in row["reason"]
    assert "the model_warmup section of poisoned_configured/config.pbtxt" in row["reason"]
    assert not client.raw.is_model_ready("poisoned_configured")
    with pytest.raises(Exception, match="UNAVAILABLE|503|no ready version"):
        client.infer("poisoned_configured", {"IN": (np.ones((1, 1), np.float32), "FP32")})


@pytest.mark.parametrize("model", [*NONCONFORMING, "misnamed_configured"])
def test_outputs_that_contradict_the_config_fail_the_load(client: Client, model: str) -> None:
    row = index_row(client, model)
    assert row["state"] == "UNAVAILABLE"
    assert f"{model}/config.pbtxt" in row["reason"]
    assert "output 'OUT'" in row["reason"]
    for words in NONCONFORMING.get(model, NONCONFORMING["misnamed"])[1]:
        assert words in row["reason"]
    assert not client.raw.is_model_ready(model)


def test_requests_meet_the_same_output_check(client: Client) -> None:
    # Without a warm-up, the first request finds what warm-up would have: the same words.
    with pytest.raises(InferenceServerException) as info:
        client.infer("misnamed_unwarmed", {"IN": (np.ones((1, 1), np.float32), "FP32")})
    assert info.value.status() in ("500", "StatusCode.INTERNAL")
    message = str(info.value.message())
    assert "model 'misnamed_unwarmed' version 1:" in message
    assert "produced no output 'OUT', which misnamed_unwarmed/config.pbtxt declares" in message


def test_automatic_warmup_failure_is_logged_as_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_python_model(tmp_path, "poisoned", POISONED_PY)
    with (
        caplog.at_level(logging.WARNING, logger="inferd"),
        run_server(tmp_path) as running,
        running.client() as c,
    ):
        assert c.get("/v2/models/poisoned/ready").status_code == 200
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("inferd.repository")
    ]
    assert any("automatic warm-up failed" in w and "zeros are poison" in w for w in warnings)


def test_warmup_time_is_exported(warm_server: RunningServer) -> None:
    from tests.support.metrics_scrape import scrape, value

    metrics = scrape(warm_server)
    assert (
        "inferd_model_warmup_duration_seconds",
        frozenset({("model", "configured"), ("version", "1")}),
    ) in metrics
    assert value(metrics, "inferd_model_state", model="configured", version="1", state="READY") == 1
