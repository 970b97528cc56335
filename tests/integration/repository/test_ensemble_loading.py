"""An ensemble's load: each graph error fails it with a message naming the step and tensor
(over HTTP and gRPC, through tritonclient's repository API); an ensemble follows its composing
models' readiness (UNAVAILABLE with the reason until they load, when one unloads; READY when
it is back) without holding the server's readiness down."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.async_infer import PROTOCOLS
from tests.support.ensemble_models import chain, ensemble_config, step, write_ensemble, write_op
from tests.support.servers import RunningServer, run_server

# (name, config, what the load error says)
GRAPH_ERRORS = [
    (
        "unknown_model",
        chain("unknown_model", ["double", "nope"]),
        "step 2 (nope): unknown composing model 'nope': no such model in the repository",
    ),
    (
        "unknown_version",
        ensemble_config("unknown_version", [step("double", {"IN": "IN"}, {"OUT": "OUT"}, 7)]),
        "step 1 (double): unknown composing model 'double' version 7: not a loaded version "
        "(loaded: 1)",
    ),
    (
        "ghost_tensor",
        ensemble_config(
            "ghost_tensor",
            [
                step("double", {"IN": "IN"}, {"OUT": "a"}),
                step("add_ten", {"IN": "ghost"}, {"OUT": "OUT"}),
            ],
        ),
        "step 2 (add_ten): input 'IN' reads tensor 'ghost', which no step produces and which "
        "is not an ensemble input",
    ),
    (
        "no_output",
        ensemble_config("no_output", [step("double", {"IN": "IN"}, {"OUT": "a"})]),
        "output 'OUT': no step produces it",
    ),
    (
        "cycle",
        ensemble_config(
            "cycle",
            [
                step("double", {"IN": "t2"}, {"OUT": "t1"}),
                step("add_ten", {"IN": "t1"}, {"OUT": "t2"}),
                step("square", {"IN": "t1"}, {"OUT": "OUT"}),
            ],
        ),
        "the steps form a cycle: step 1 (double) reads 't2' from step 2 (add_ten); step 2 "
        "(add_ten) reads 't1' from step 1 (double)",
    ),
    (
        "wrong_dtype",
        ensemble_config(
            "wrong_dtype", [step("double", {"IN": "IN"}, {"OUT": "OUT"})], out_type="TYPE_INT32"
        ),
        "tensor 'OUT': datatype mismatch: step 1 (double) output 'OUT' gives FP32 [-1, -1], "
        "the ensemble's output 'OUT' takes INT32 [-1, -1]",
    ),
    (
        "wrong_shape",
        ensemble_config("wrong_shape", [step("single", {"IN": "IN"}, {"OUT": "OUT"})], in_dims="2"),
        "tensor 'IN': shape mismatch: input gives FP32 [-1, 2], step 1 (single) input 'IN' "
        "takes FP32 [-1, 1]",
    ),
    (  # between two steps: FP32 out of one, INT32 into the next
        "step_dtype",
        ensemble_config(
            "step_dtype",
            [
                step("double", {"IN": "IN"}, {"OUT": "a"}),
                step("double_int", {"IN": "a"}, {"OUT": "OUT"}),
            ],
            out_type="TYPE_INT32",
        ),
        "tensor 'a': datatype mismatch: step 1 (double) output 'OUT' gives FP32 [-1, -1], "
        "step 2 (double_int) input 'IN' takes INT32 [-1, -1]",
    ),
    (  # between two steps: rows one value wide out of one, two wide into the next
        "step_shape",
        ensemble_config(
            "step_shape",
            [
                step("single", {"IN": "IN"}, {"OUT": "a"}),
                step("pair", {"IN": "a"}, {"OUT": "OUT"}),
            ],
            in_dims="1",
        ),
        "tensor 'a': shape mismatch: step 1 (single) output 'OUT' gives FP32 [-1, 1], "
        "step 2 (pair) input 'IN' takes FP32 [-1, 2]",
    ),
    (
        "too_big",
        chain("too_big", ["double"], max_batch_size=128),
        "step 1 (double): the ensemble's max_batch_size 128 exceeds model 'double''s 64",
    ),
    (
        "unknown_input",
        ensemble_config("unknown_input", [step("double", {"X": "IN"}, {"OUT": "OUT"})]),
        "step 1 (double): input_map names input 'X', which model 'double' does not have",
    ),
    (
        "instances",
        chain("instances", ["double"]) + "instance_group [ { count: 2 } ]\n",
        "instances/config.pbtxt: instance_group: not read for an ensemble",
    ),
    (  # an ensemble reads its cache's parameters only
        "batch_param",
        chain("batch_param", ["double"])
        + "response_cache { enable: true }\n"
        + 'parameters { key: "pad_inputs" value: { string_value: "IN" } }\n',
        "batch_param/config.pbtxt: parameters.pad_inputs: not read for an ensemble",
    ),
    (  # ...and those only with its cache on
        "cache_param",
        chain("cache_param", ["double"])
        + 'parameters { key: "cache_text_normalize" value: { string_value: "lower" } }\n',
        "cache_param/config.pbtxt: parameters.cache_text_normalize is set but response_cache",
    ),
    (
        "two_producers",
        ensemble_config(
            "two_producers",
            [
                step("double", {"IN": "IN"}, {"OUT": "OUT"}),
                step("add_ten", {"IN": "IN"}, {"OUT": "OUT"}),
            ],
        ),
        "step 2 (add_ten): output 'OUT' writes tensor 'OUT', which step 1 (double) already "
        "produces",
    ),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensemble_loading")
    repo, records = root / "models", root / "records"
    records.mkdir()
    write_op(repo, "double", "double", records)
    write_op(repo, "add_ten", "add_ten", records)
    write_op(repo, "square", "square", records)
    write_op(repo, "single", "double", records, dims="1")
    write_op(repo, "pair", "double", records, dims="2")
    write_op(repo, "double_int", "double", records, data_type="TYPE_INT32")
    for name, config, _ in GRAPH_ERRORS:
        write_ensemble(repo, name, config)
    # Its own server (the graph errors above hold the other's readiness down): an ensemble
    # loaded at start, before the models it is made of.
    lifecycle = root / "lifecycle"
    write_op(lifecycle, "late_double", "double", records)
    write_op(lifecycle, "late_add", "add_ten", records)
    write_ensemble(lifecycle, "waiting", chain("waiting", ["late_double", "late_add"]))
    write_ensemble(lifecycle, "healing", chain("healing", ["missing"]))
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[RunningServer]:
    with run_server(
        root / "models",
        model_control_mode="explicit",
        load_models=("double", "add_ten", "square", "single", "pair", "double_int"),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def lifecycle_server(root: Path) -> Iterator[RunningServer]:
    with run_server(
        root / "lifecycle", model_control_mode="explicit", load_models=("waiting",)
    ) as running:
        yield running


@contextlib.contextmanager
def _repository(protocol: str, server: RunningServer) -> Iterator[Any]:
    """tritonclient's client for `protocol`, closed after use."""
    client: Any = (
        httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_address)
    )
    try:
        yield client
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("name", "expected"), [(n, e) for n, _, e in GRAPH_ERRORS])
def test_a_graph_error_fails_the_load_naming_step_and_tensor(
    server: RunningServer, protocol: str, name: str, expected: str
) -> None:
    with _repository(protocol, server) as client, pytest.raises(InferenceServerException) as caught:
        client.load_model(name)
    assert expected in str(caught.value.message())
    rows = httpx.post(f"{server.url}/v2/repository/index").json()
    row = next(r for r in rows if r["name"] == name)
    assert row["state"] == "UNAVAILABLE"
    assert expected in row["reason"]


def _state(server: RunningServer, name: str) -> tuple[str, str]:
    rows = httpx.post(f"{server.url}/v2/repository/index").json()
    row: dict[str, str] = next((r for r in rows if r["name"] == name), {})
    return row.get("state", ""), row.get("reason", "")


def _infer(server: RunningServer) -> httpx.Response:
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    return httpx.post(f"{server.url}/v2/models/waiting/infer", json=body)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_follows_its_composing_models(
    lifecycle_server: RunningServer, protocol: str
) -> None:
    with _repository(protocol, lifecycle_server) as repository:
        _follows(lifecycle_server, repository)


def _follows(server: RunningServer, repository: Any) -> None:
    for model in ("late_double", "late_add"):  # loaded by the other protocol's case
        if _state(server, model)[0] == "READY":
            repository.unload_model(model)
    # Loaded before the models it is made of (at start, for the first case).
    state, reason = _state(server, "waiting")
    assert state == "UNAVAILABLE"
    assert "step 1 (late_double): composing model 'late_double' is not ready" in reason
    assert not repository.is_model_ready("waiting")
    r = _infer(server)
    assert r.status_code == 503
    assert "composing model 'late_double' is not ready" in r.json()["error"]
    # It waits: the server stays ready (its composing models were asked for by no one yet).
    assert repository.is_server_ready()

    repository.load_model("late_double")
    repository.load_model("late_add")
    assert _state(server, "waiting") == ("READY", "")
    assert repository.is_model_ready("waiting")
    assert _infer(server).json()["outputs"][0]["data"] == [12.0]

    repository.unload_model("late_add")
    state, reason = _state(server, "waiting")
    assert state == "UNAVAILABLE"
    assert reason.endswith("step 2 (late_add): composing model 'late_add' is not ready: unloaded")
    assert _infer(server).status_code == 503
    assert repository.is_server_ready()

    repository.load_model("late_add")  # reloading it brings the ensemble back
    assert _state(server, "waiting") == ("READY", "")
    np.testing.assert_array_equal(_infer(server).json()["outputs"][0]["data"], [12.0])


def test_an_unknown_composing_model_fails_the_load_until_it_appears(
    root: Path, lifecycle_server: RunningServer
) -> None:
    with _repository("http", lifecycle_server) as repository:
        with pytest.raises(InferenceServerException) as caught:
            repository.load_model("healing")
        assert "step 1 (missing): unknown composing model 'missing'" in caught.value.message()
        assert not repository.is_server_ready()  # a failed load, as any model's
        write_op(root / "lifecycle", "missing", "add_ten", root / "records")
        repository.load_model("missing")
        assert _state(lifecycle_server, "healing") == ("READY", "")
        assert repository.is_server_ready()


def _until_state(server: RunningServer, name: str, state: str) -> str:
    """The model's reason once the index shows `state` (the poller works in the background)."""
    deadline = time.monotonic() + 30
    while (found := _state(server, name))[0] != state:
        assert time.monotonic() < deadline, f"{name} never became {state}: {found}"
        time.sleep(0.02)
    return found[1]


def test_poll_mode_follows_composing_models_added_and_removed(tmp_path: Path) -> None:
    repo, records = tmp_path / "models", tmp_path / "records"
    records.mkdir()
    write_op(repo, "zz_double", "double", records)
    # Named to sort first: the poller loads a round's new models in name order.
    write_ensemble(repo, "aa_pipeline", chain("aa_pipeline", ["zz_double"]))
    with run_server(repo, model_control_mode="poll", repository_poll_s=0.05) as server:
        assert _state(server, "aa_pipeline") == ("READY", "")  # loaded after zz_double
        shutil.rmtree(repo / "zz_double")
        reason = _until_state(server, "aa_pipeline", "UNAVAILABLE")
        assert "composing model 'zz_double'" in reason
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
        write_op(repo, "zz_double", "double", records)
        _until_state(server, "aa_pipeline", "READY")
        # Added in one round with a model it needs, loaded before it: it waits, then serves.
        write_op(repo, "zz_add", "add_ten", records)
        write_ensemble(repo, "ab_pipeline", chain("ab_pipeline", ["zz_double", "zz_add"]))
        _until_state(server, "ab_pipeline", "READY")
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
        r = httpx.post(f"{server.url}/v2/models/ab_pipeline/infer", json=body)
        assert r.json()["outputs"][0]["data"] == [12.0]
