"""Drift of predicted classes (chi-square) and of a BYTES input (length and token-count KS
and PSI) through a live server, over HTTP and gRPC: a Python model labels each text by
its word count; texts like the reference's keep every alert off, longer texts shift both
the lengths and the predicted classes past their thresholds, in GET .../drift and in
inferd_drift_score / inferd_drift_p_value / inferd_drift_alerting."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.monitoring.reference import npz_bytes
from tests.support.async_infer import PROTOCOLS
from tests.support.metrics_scrape import scrape, value
from tests.support.servers import RunningServer, run_server

# The label is the word count in fours, capped at class 3: longer texts, higher classes.
LABEL_PY = """
import numpy as np

class Model:
    def predict(self, inputs):
        words = [len(bytes(t).split()) for t in inputs["text"].ravel()]
        labels = np.minimum(np.array(words, dtype=np.int64) // 4, 3)
        return {"label": labels.reshape(-1, 1)}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "text", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [ {{ name: "label", data_type: TYPE_INT64, dims: [ 1 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "drift_window" value: {{ string_value: "200" }} }}
parameters {{ key: "drift_cpu_budget" value: {{ string_value: "1" }} }}
parameters {{ key: "drift_class_outputs" value: {{ string_value: "label" }} }}
"""


def texts(rng: np.random.Generator, n: int, mean_words: float) -> np.ndarray:
    """(n, 1) texts of 1 + Poisson(mean_words) words of varied lengths."""
    out = []
    for count in rng.poisson(mean_words, size=n) + 1:
        out.append(" ".join("w" * int(k) for k in rng.integers(1, 8, size=count)).encode())
    return np.array(out, dtype=object).reshape(n, 1)


def labels_of(rows: np.ndarray) -> np.ndarray:
    words = np.array([len(bytes(t).split()) for t in rows.ravel()], dtype=np.int64)
    return np.minimum(words // 4, 3).reshape(-1, 1)


def write_model(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name)))
    (repo / name / "1" / "model.py").write_text(LABEL_PY)
    reference = texts(np.random.default_rng(0), 2000, 6)
    arrays = {"text": reference.astype("S"), "label": labels_of(reference)}
    (repo / name / "1" / "reference.npz").write_bytes(npz_bytes(arrays))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("drift_classes_repo")
    for protocol in PROTOCOLS:
        write_model(repo, f"labeller_{protocol}")
    with run_server(repo) as running:
        yield running


def infer(server: RunningServer, protocol: str, model: str, rows: np.ndarray) -> None:
    _send(server, protocol, model, rows)
    # Each batch tested before the next is sent: the queue never fills, so no sample is
    # dropped and each window holds exactly the rows the test means it to (deterministic).
    monitor = server.server.registry.get(model).drift
    assert monitor is not None
    monitor.wait_idle()


def _send(server: RunningServer, protocol: str, model: str, rows: np.ndarray) -> None:
    if protocol == "http":
        data = [bytes(t).decode() for t in rows.ravel()]
        doc = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(rows), 1], "data": data}]
        }
        r = httpx.post(f"{server.url}/v2/models/{model}/infer", json=doc, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == labels_of(rows).ravel().tolist()
        return
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        inp = grpcclient.InferInput("text", [len(rows), 1], "BYTES")
        inp.set_data_from_numpy(rows)
        answer = client.infer(model, [inp]).as_numpy("label")
        assert (answer == labels_of(rows)).all()


def report(server: RunningServer, model: str) -> dict[str, dict[str, Any]]:
    monitor = server.server.registry.get(model).drift
    assert monitor is not None
    monitor.wait_idle()  # every sample queued so far is tested
    r = httpx.get(f"{server.url}/v2/models/{model}/drift", timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["state"] == "monitoring", doc
    return {t["name"]: t for t in doc["tensors"]}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_longer_texts_drift_their_lengths_and_the_predicted_classes(
    server: RunningServer, protocol: str
) -> None:
    model = f"labeller_{protocol}"
    labels = {"model": model, "version": "1"}
    rng = np.random.default_rng(21)
    for _ in range(20):  # 400 texts like the reference's: 3 windows
        infer(server, protocol, model, texts(rng, 20, 6))
    calm = report(server, model)
    assert calm["label"]["kind"] == "classes" and calm["text"]["kind"] == "bytes"
    assert [c["column"] for c in calm["text"]["columns"]] == ["length", "tokens"]
    for tensor, tests in (("label", ("chi2",)), ("text", ("ks", "psi"))):
        for test in tests:
            assert calm[tensor]["tests"][test]["alerting"] is False, (tensor, calm[tensor])
    before = scrape(server)
    for tensor, test in (("label", "chi2"), ("text", "ks"), ("text", "psi")):
        for name in ("inferd_drift_score", "inferd_drift_alerting"):
            # `value` reads a missing series as 0: each must be there to be compared.
            assert (name, frozenset({**labels, "tensor": tensor, "test": test}.items())) in before
    chi2_before = value(before, "inferd_drift_p_value", **labels, tensor="label", test="chi2")
    length_ks_before = value(before, "inferd_drift_score", **labels, tensor="text", test="ks")
    psi_before = value(before, "inferd_drift_score", **labels, tensor="text", test="psi")
    assert chi2_before > 0.001 and psi_before < 0.2, calm

    for _ in range(20):  # 400 longer texts: the last windows hold nothing else
        infer(server, protocol, model, texts(rng, 20, 14))
    shifted = report(server, model)
    assert shifted["label"]["tests"]["chi2"]["alerting"], shifted["label"]
    assert shifted["text"]["tests"]["ks"]["alerting"], shifted["text"]
    assert shifted["text"]["tests"]["psi"]["alerting"], shifted["text"]
    after = scrape(server)
    for tensor, test in (("label", "chi2"), ("text", "ks"), ("text", "psi")):
        assert value(before, "inferd_drift_alerting", **labels, tensor=tensor, test=test) == 0
        assert value(after, "inferd_drift_alerting", **labels, tensor=tensor, test=test) == 1
    assert value(after, "inferd_drift_p_value", **labels, tensor="label", test="chi2") < 0.001
    chi2_score = value(after, "inferd_drift_score", **labels, tensor="label", test="chi2")
    assert chi2_score > value(before, "inferd_drift_score", **labels, tensor="label", test="chi2")
    assert value(after, "inferd_drift_score", **labels, tensor="text", test="ks") > length_ks_before
    assert value(after, "inferd_drift_p_value", **labels, tensor="text", test="ks") < 0.001
    assert value(after, "inferd_drift_score", **labels, tensor="text", test="psi") > 0.2
