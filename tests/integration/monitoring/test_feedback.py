"""Feedback and online accuracy (docs/capture.md): labels joined to captured predictions
(requests over JSON, binary HTTP and gRPC; feedback is HTTP's), `inferd_online_accuracy`
equal to a hand count per version, a canary's beside stable's; unknown, expired, repeated
and malformed feedback answered and counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.support.capture_clients import WIRES, Client
from tests.support.metrics_scrape import scrape, value
from tests.support.models import builders
from tests.support.monitoring_models import parameters, write_signed_model
from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("feedback_repo")
    # Version 2 predicts the opposite class of version 1 (c = -1: argmax becomes argmin).
    write_signed_model(
        repo,
        "judged",
        {1: 1.0, 2: -1.0},
        "version_policy: { all { } }\n"
        + parameters(capture_sample_rate=1, canary_weights='{"2": 50, "1": 50}'),
    )
    write_signed_model(
        repo,
        "by_index",
        extra=parameters(capture_sample_rate=1, accuracy_output="cls", accuracy_window=4),
    )
    write_signed_model(repo, "quick", extra=parameters(capture_sample_rate=1, feedback_ttl_s=1e-6))
    write_signed_model(repo, "silent")  # capture_sample_rate 0
    guarded = parameters(
        capture_sample_rate=1,
        canary_weights='{"2": 50, "1": 50}',
        canary_auto_rollback="true",
        canary_min_requests=10,
        canary_accuracy_margin=0.1,
        canary_p99_ratio=1e9,  # judged on accuracy alone here, never on a slow moment
    )
    policy = "version_policy: { all { } }\n"
    write_signed_model(repo, "worse_canary", {1: 1.0, 2: -1.0}, policy + guarded)
    write_signed_model(repo, "equal_canary", {1: 1.0, 2: 1.0}, policy + guarded)
    with run_server(repo) as running:  # no --capture-dir: feedback needs none
        yield running


def _feedback(http: httpx.Client, model: str, doc: dict[str, Any]) -> httpx.Response:
    return http.post(f"/v2/models/{model}/feedback", json=doc)


def test_accuracy_matches_a_hand_count_per_version_canary_beside_stable(
    server: RunningServer,
) -> None:
    rng = np.random.default_rng(3)
    right: Counter[str] = Counter()
    labelled: Counter[str] = Counter()
    with server.client() as http:
        for wire in WIRES:
            with Client(wire, server) as client:
                for i in range(30):
                    x = rng.normal(size=(1 + i % 2, 4)).astype(np.float32)
                    answer = client.infer("judged", x)
                    truth = [int(c) for c in np.argmax(x, axis=1)]  # version 1 is right
                    if i % 5 == 0:
                        truth = [(t + 1) % 4 for t in truth]  # ... except for these
                    label: Any = truth if len(truth) > 1 else truth[0]
                    r = _feedback(http, "judged", {"id": answer.id, "label": label})
                    assert r.status_code == 200, r.text
                    predicted = np.argmax(answer.y, axis=1).tolist()
                    outcomes = [p == t for p, t in zip(predicted, truth, strict=True)]
                    assert r.json()["correct"] == outcomes
                    assert r.json()["version"] == answer.version
                    right[answer.version] += sum(outcomes)
                    labelled[answer.version] += len(outcomes)
    samples = scrape(server)
    assert set(labelled) == {"1", "2"}, "the 50/50 split served both versions"
    for version in ("1", "2"):
        accuracy = value(samples, "inferd_online_accuracy", model="judged", version=version)
        assert accuracy == pytest.approx(right[version] / labelled[version])
        rows = value(samples, "inferd_online_accuracy_rows", model="judged", version=version)
        assert rows == labelled[version]
    stable = value(samples, "inferd_online_accuracy", model="judged", version="1")
    canary = value(samples, "inferd_online_accuracy", model="judged", version="2")
    assert stable > canary  # the canary predicts the wrong class: visible beside stable
    joined = sum(
        value(samples, "inferd_feedback_total", model="judged", version=v, outcome="joined")
        for v in ("1", "2")
    )
    assert joined == 90


def test_an_integer_class_output_and_a_window_of_the_last_rows(server: RunningServer) -> None:
    outcomes: list[bool] = []
    with server.client() as http, Client("json", server) as client:
        for i in range(7):
            x = np.eye(4, dtype=np.float32)[[i % 4]]
            answer = client.infer("by_index", x)
            label = i % 4 if i % 3 else (i + 1) % 4
            r = _feedback(http, "by_index", {"id": answer.id, "label": label})
            assert r.status_code == 200, r.text
            outcomes.append(int(answer.cls[0, 0]) == label)
    last = outcomes[-4:]  # accuracy_window 4: the last four labels only
    samples = scrape(server)
    accuracy = value(samples, "inferd_online_accuracy", model="by_index", version="1")
    assert accuracy == pytest.approx(sum(last) / 4)
    assert value(samples, "inferd_online_accuracy_rows", model="by_index", version="1") == 4


def _outcome(server: RunningServer, model: str, version: str, outcome: str) -> float:
    samples = scrape(server)
    return value(samples, "inferd_feedback_total", model=model, version=version, outcome=outcome)


def test_an_unknown_id_is_404_and_counted(server: RunningServer) -> None:
    before = _outcome(server, "judged", "", "unknown_id")
    with server.client() as http:
        r = _feedback(http, "judged", {"id": "never-sent", "label": 1})
    assert r.status_code == 404
    assert "never-sent" in r.json()["error"]
    assert _outcome(server, "judged", "", "unknown_id") == before + 1


def test_an_expired_prediction_is_404_and_counted(server: RunningServer) -> None:
    with server.client() as http, Client("json", server) as client:
        answer = client.infer("quick", np.ones((1, 4), np.float32))
        r = _feedback(http, "quick", {"id": answer.id, "label": 0})  # past its 1 µs
    assert r.status_code == 404
    assert "expired" in r.json()["error"] and "feedback_ttl_s" in r.json()["error"]
    assert _outcome(server, "quick", "1", "expired") == 1


def test_a_second_label_for_one_request_is_refused_and_counted(server: RunningServer) -> None:
    with server.client() as http, Client("json", server) as client:
        answer = client.infer("by_index", np.ones((1, 4), np.float32))
        assert _feedback(http, "by_index", {"id": answer.id, "label": 0}).status_code == 200
        again = _feedback(http, "by_index", {"id": answer.id, "label": 1})
    assert again.status_code == 400
    assert "already has its label" in again.json()["error"]
    assert _outcome(server, "by_index", "1", "duplicate") == 1


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"label": 1}, ["'id'"]),
        ({"id": 5, "label": 1}, ["'id'"]),
        ({"id": "ID"}, ["'label'"]),
        ({"id": "ID", "label": "cat"}, ["'label'", "'cat'", "class index"]),
        ({"id": "ID", "label": [1, 2]}, ["'label'", "one label per row", "1"]),
        ({"id": "ID", "label": True}, ["'label'", "class index"]),
    ],
)
def test_a_malformed_feedback_is_400_naming_the_field(
    server: RunningServer, doc: dict[str, Any], words: list[str]
) -> None:
    with server.client() as http, Client("json", server) as client:
        answer = client.infer("judged", np.ones((1, 4), np.float32))
        doc = {k: answer.id if v == "ID" else v for k, v in doc.items()}
        r = _feedback(http, "judged", doc)
        assert r.status_code == 400, r.text
        for word in words:
            assert word in r.json()["error"]
        if "label" in doc and doc.get("id") == answer.id:  # still open to a good label
            assert _feedback(http, "judged", {"id": answer.id, "label": 0}).status_code == 200


def test_feedback_to_a_model_that_captures_nothing_or_none_at_all(
    server: RunningServer,
) -> None:
    with server.client() as http:
        silent = _feedback(http, "silent", {"id": "x", "label": 0})
        unknown = _feedback(http, "no_such_model", {"id": "x", "label": 0})
        body = http.post("/v2/models/judged/feedback", content=b"[1]")
    assert silent.status_code == 400
    assert "capture_sample_rate" in silent.json()["error"]
    assert unknown.status_code == 404
    assert body.status_code == 400


def test_an_output_of_one_score_per_row_is_no_class_output(tmp_path: Path) -> None:
    """A regression-like output (FP32, one value per row): feedback answers 400 saying why."""
    (tmp_path / "score").mkdir()
    (tmp_path / "score" / "config.pbtxt").write_text(
        'name: "score"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        + parameters(capture_sample_rate=1)
    )
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "score",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    builders._save(model, tmp_path / "score" / "1" / "model.onnx")
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]}
    with run_server(tmp_path) as running, running.client() as http:
        answer = http.post("/v2/models/score/infer", json=doc).json()
        r = _feedback(http, "score", {"id": answer["id"], "label": 0})
    assert r.status_code == 400
    error = r.json()["error"]
    assert "no class output" in error and "'y'" in error and "1 value per row" in error


@pytest.mark.parametrize(
    ("model", "rolled_back"), [("worse_canary", True), ("equal_canary", False)]
)
def test_a_canary_less_accurate_by_the_margin_loses_its_traffic(
    server: RunningServer, model: str, rolled_back: bool
) -> None:
    rng = np.random.default_rng(11)
    served: Counter[str] = Counter()
    with server.client() as http, Client("json", server) as client:
        for _ in range(80):
            x = rng.normal(size=(1, 4)).astype(np.float32)
            answer = client.infer(model, x)
            served[answer.version] += 1
            label = int(np.argmax(x))  # version 1 is always right
            assert _feedback(http, model, {"id": answer.id, "label": label}).status_code == 200
            if served["1"] >= 10 and served["2"] >= 10 and rolled_back:
                break  # both past canary_min_requests labels: judged at this label
        routing = http.get(f"/v2/models/{model}/routing").json()
    assert served["2"] >= 10 and served["1"] >= 10
    if rolled_back:
        assert routing["weights"]["2"] == 0 and routing["rollbacks"] == {"2": 1}
    else:
        assert routing["weights"] == {"1": 50, "2": 50} and routing["rollbacks"] == {}


def test_past_the_bound_the_oldest_predictions_are_forgotten(server: RunningServer) -> None:
    feedback = server.server.capture.feedback
    saved, feedback.max_pending = feedback.max_pending, 3
    try:
        with server.client() as http, Client("json", server) as client:
            ids = [client.infer("by_index", np.ones((1, 4), np.float32)).id for _ in range(5)]
            oldest = _feedback(http, "by_index", {"id": ids[0], "label": 0})
            newest = _feedback(http, "by_index", {"id": ids[-1], "label": 0})
    finally:
        feedback.max_pending = saved
    assert oldest.status_code == 404 and "3 newer" in oldest.json()["error"]
    assert newest.status_code == 200


def test_feedback_needs_the_inference_credential(tmp_path: Path) -> None:
    """A data-plane call: a credential on the `inference` API group guards it as infer."""
    write_signed_model(tmp_path, "m", extra=parameters(capture_sample_rate=1))
    restricted = ("inference:infer-key=s3cret",)
    with run_server(tmp_path, http_restricted_api=restricted) as running, running.client() as http:
        refused = _feedback(http, "m", {"id": "x", "label": 0})
        allowed = http.post(
            "/v2/models/m/feedback", json={"id": "x", "label": 0}, headers={"infer-key": "s3cret"}
        )
    assert refused.status_code == 401, refused.text
    assert allowed.status_code == 404  # through the gate: the id is unknown


def test_a_worker_of_several_refuses_feedback(server: RunningServer) -> None:
    """With --workers N the answering worker holds the prediction: another may not join it."""
    capture = server.server.capture
    with server.client() as http, Client("json", server) as client:
        answer = client.infer("by_index", np.ones((1, 4), np.float32))
        capture.single_process = False  # as in a worker of --workers 2
        try:
            r = _feedback(http, "by_index", {"id": answer.id, "label": 0})
        finally:
            capture.single_process = True
    assert r.status_code == 400
    assert "--workers" in r.json()["error"]
