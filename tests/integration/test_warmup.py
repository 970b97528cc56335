"""Warm-up runs before a version is READY; a version that fails it never takes traffic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.lifecycle_models import WARM_COUNTING_PY, write_python_model
from tests.servers import RunningServer, run_server

BODY = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}


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
        extra='parameters { key: "auto_warmup" value: { string_value: "false" } }',
    )
    write_python_model(
        repo,
        "poisoned",
        WARM_COUNTING_PY.replace("return False", "return True"),
    )
    with run_server(repo) as running:
        yield running


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


def test_failed_warmup_keeps_the_version_out_of_service(warm_server: RunningServer) -> None:
    with warm_server.client() as c:
        rows = [r for r in c.post("/v2/repository/index").json() if r["name"] == "poisoned"]
        r = c.post("/v2/models/poisoned/infer", json=BODY)
    assert rows[0]["state"] == "UNAVAILABLE"
    assert "warm-up 'auto batch 1' failed" in rows[0]["reason"]
    assert "zeros are poison" in rows[0]["reason"]
    assert r.status_code == 503


def test_warmup_time_is_exported(warm_server: RunningServer) -> None:
    from tests.integration.test_metrics import scrape, value

    metrics = scrape(warm_server)
    assert (
        "inferd_model_warmup_duration_seconds",
        frozenset({("model", "configured"), ("version", "1")}),
    ) in metrics
    assert value(metrics, "inferd_model_state", model="configured", version="1", state="READY") == 1
