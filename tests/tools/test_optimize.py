"""`inferd optimize` on models the tests build: an INT8 winner is published and serves (ONNX
over HTTP and gRPC, TorchScript), INT8 that destroys accuracy is refused with the measured
drop, and bad input exits 2 naming the option or file. Eligibility never rests on a timing:
the tests that want a winner pass --min-speedup 0."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from inferd_tools.optimize.publish import REPORT_FILE, file_sha256
from tests.support.models import builders, write_counter
from tests.support.optimize_models import write_mlp, write_outlier_classifier, write_torch_mlp
from tests.support.optimize_runs import Run, optimize
from tests.support.servers import RunningServer, run_server
from tests.support.torch_models import build_torch_repository

ROWS = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)


def candidate(run: Run, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in run.report["candidates"] if c["name"] == name)
    return found


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The MLP optimised with validation data and labels (the original's own classes), the
    INT8 winner published as version 2."""
    work = tmp_path_factory.mktemp("optimize")
    repo = work / "repo"
    model_dir = write_mlp(repo)
    validation = np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32)
    np.savez(work / "validation.npz", input=validation)
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    np.save(work / "labels.npy", session.run(["label"], {"input": validation})[0][:, 0])
    run = optimize(
        repo, "mlp", "--try", "int8-dynamic", "--min-speedup", "0",
        "--max-accuracy-drop", "10%", "--validation", str(work / "validation.npz"),
        "--labels", str(work / "labels.npy"), "--publish", report=work / "report.json",
    )  # fmt: skip
    return repo, run


def test_the_winner_is_published_with_its_report_and_checksum(
    published: tuple[Path, Run],
) -> None:
    repo, run = published
    assert run.code == 0, run.stderr
    assert run.report["winner"] == "int8-dynamic"
    winner = candidate(run, "int8-dynamic")
    assert winner["eligible"] and winner["winner"] and winner["reason"].startswith("won")
    accuracy = winner["accuracy"]
    assert accuracy["original_label_accuracy"] == 1.0  # the labels are its own classes
    assert 0.9 <= accuracy["label_accuracy"] <= 1.0
    assert accuracy["drop"] == pytest.approx(1.0 - accuracy["label_accuracy"])
    version = repo / "mlp" / "2"
    assert sorted(p.name for p in version.iterdir()) == ["model.onnx", REPORT_FILE]
    beside = json.loads((version / REPORT_FILE).read_text())
    assert beside["published"]["model_sha256"] == file_sha256(version / "model.onnx")
    assert beside["winner"] == "int8-dynamic"
    assert run.report["published"]["version"] == 2
    assert not list(repo.glob(".inferd-optimize-*"))  # the staging folder was renamed
    assert "int8-dynamic *" in run.stdout and "won: the fastest eligible" in run.stdout


@pytest.fixture(scope="module")
def server(published: tuple[Path, Run]) -> Iterator[RunningServer]:
    repo, _ = published
    with run_server(repo) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_published_version_serves(
    published: tuple[Path, Run], server: RunningServer, protocol: str
) -> None:
    repo, run = published
    client: Any
    if protocol == "http":
        client, module = httpclient.InferenceServerClient(server.url[len("http://") :]), httpclient
    else:
        client, module = grpcclient.InferenceServerClient(server.grpc_address), grpcclient
    config = client.get_model_config("mlp", "2")
    if protocol == "grpc":
        checksum = config.config.parameters["model_checksum"].string_value
    else:
        checksum = config["parameters"]["model_checksum"]["string_value"]
    assert checksum == run.report["published"]["checksum"]
    inp = module.InferInput("input", list(ROWS.shape), "FP32")
    inp.set_data_from_numpy(ROWS)
    result = client.infer("mlp", [inp], model_version="2")
    session = ort.InferenceSession(str(repo / "mlp" / "2" / "model.onnx"))
    expected = session.run(["probabilities"], {"input": ROWS})[0]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)
    response = result.get_response()
    served_version = response["model_version"] if protocol == "http" else response.model_version
    assert served_version == "2"


def test_int8_that_destroys_accuracy_is_refused_with_the_measured_drop(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_outlier_classifier(repo)
    run = optimize(
        repo, "outlier", "--try", "int8-dynamic,int8-static", "--min-speedup", "0",
        "--publish", report=tmp_path / "report.json",
    )  # fmt: skip
    assert run.code == 3, run.stderr
    assert run.report["winner"] is None and run.report["published"] is None
    for name in ("int8-dynamic", "int8-static"):
        refused = candidate(run, name)
        assert refused["status"] == "measured" and not refused["eligible"]
        drop = refused["accuracy"]["drop"]
        assert drop > 0.5  # the small weights are gone: the class is mostly lost
        assert f"accuracy drop {drop * 100:.2f}% > 1.00%" in refused["reason"]
        assert "top-1 agreement of 'probabilities'" in refused["reason"]
    assert "no eligible candidate: nothing is published" in run.stdout
    assert sorted(p.name for p in (repo / "outlier").iterdir()) == ["1", "config.pbtxt"]
    assert "synthetic" in run.report["data"]["accuracy_basis"]


def test_a_torchscript_int8_winner_is_published_and_serves(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_torch_mlp(repo)
    run = optimize(
        repo, "mlp_torch", "--min-speedup", "0", "--max-accuracy-drop", "10%", "--publish",
        "--plot", str(tmp_path / "report.png"), report=tmp_path / "report.json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert [c["name"] for c in run.report["candidates"]] == ["int8-dynamic", "onnx-export"]
    assert run.report["winner"] == "int8-dynamic"
    exported = candidate(run, "onnx-export")
    assert exported["status"] == "measured" and exported["accuracy"]["drop"] < 1e-3
    assert "ONNX file cannot be a version of this TorchScript model" in exported["reason"]
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (repo / "mlp_torch" / "2" / "model.pt").is_file()
    with run_server(repo) as running:
        client = httpclient.InferenceServerClient(running.url[len("http://") :])
        inp = httpclient.InferInput("input", list(ROWS.shape), "FP32")
        inp.set_data_from_numpy(ROWS)
        result = client.infer("mlp_torch", [inp], model_version="2")
    assert result.get_response()["model_version"] == "2"
    # INT8 weights: close to version 1's answer, not equal to it.
    got = result.as_numpy("probabilities")
    original = torch.jit.load(str(repo / "mlp_torch" / "1" / "model.pt"))
    want = original(torch.from_numpy(ROWS))[0].detach().numpy()
    assert got is not None
    assert 0 < np.abs(got - want).max() < 0.05


def _npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return str(path)


# (case, model writer, extra arguments (a callable of the work dir), message expected)
BAD_INPUTS: list[tuple[str, str, Any, str]] = [
    ("missing model", "mlp", lambda w: ["-m", "nope"], "-m nope: no model directory"),
    (
        "unsupported backend",
        "counter",
        lambda w: [],
        "counter: unsupported backend: the model uses the python backend",
    ),
    (
        "calibration of the wrong shape",
        "mlp",
        lambda w: ["--calibration", _npz(w / "c.npz", input=np.zeros((10, 63), np.float32))],
        "array 'input': shape [10, 63], expected shape [N, 64]",
    ),
    (
        "calibration without an input",
        "mlp",
        lambda w: ["--calibration", _npz(w / "c.npz", x=np.zeros((10, 64), np.float32))],
        "array 'x' is not an input of mlp (inputs: input)",
    ),
    (
        "validation of the wrong dtype",
        "mlp",
        lambda w: ["--validation", _npz(w / "v.npz", input=np.zeros((10, 64), np.int32))],
        "array 'input': dtype int32, the input is float32",
    ),
    (
        "labels of the wrong length",
        "mlp",
        lambda w: [
            "--validation",
            _npz(w / "v.npz", input=np.zeros((10, 64), np.float32)),
            "--labels",
            _npz(w / "l.npz", labels=np.zeros(9, np.int64)),
        ],  # fmt: skip
        "shape [9], expected [10]: one class per validation sample",
    ),
    ("labels without validation", "mlp", lambda w: ["--labels", "l.npy"], "--labels needs"),
    ("unknown candidate", "mlp", lambda w: ["--try", "int4"], "--try 'int4': unknown candidate"),
    ("a bad drop", "mlp", lambda w: ["--max-accuracy-drop", "5"], "expected a share in [0, 1]"),
    ("a missing version", "mlp", lambda w: ["--version", "7"], "--version 7: mlp has versions 1"),
    (
        "canary without a server",
        "mlp",
        lambda w: ["--publish", "--canary", "10"],
        "--canary needs --publish and --server",
    ),
    (
        "canary under a policy serving one version",
        "mlp",
        lambda w: ["--publish", "--canary", "10", "--server", "127.0.0.1:9"],
        "--canary: mlp/config.pbtxt's version_policy would not serve version 1",
    ),
]


@pytest.mark.parametrize(
    ("model", "arguments", "message"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_exits_2_naming_it(
    tmp_path: Path, model: str, arguments: Any, message: str
) -> None:
    repo = tmp_path / "repo"
    write_mlp(repo) if model == "mlp" else write_counter(repo, "counter")
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    run = optimize(repo, model, *arguments(tmp_path))
    assert run.code == 2
    assert run.stderr.startswith("inferd optimize: ")
    assert message in run.stderr
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before  # nothing written


def test_the_command_line_exits_2_on_a_missing_model(tmp_path: Path) -> None:
    """The real `inferd optimize` entry point, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "inferd", "optimize", "-m", "nope", "--model-repository",
         str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"inferd optimize: -m nope: no model directory {tmp_path / 'nope'}" in done.stderr


def test_what_cannot_be_built_for_torch_models_is_reported_with_the_reason(
    tmp_path: Path,
) -> None:
    """A torch.export program cannot be quantised dynamically; a TorchScript model without
    Linear layers neither, while its ONNX export (INPUT__<i> / OUTPUT__<i> names, outputs
    declared out of order) computes exactly what it does."""
    repo = tmp_path / "repo"
    build_torch_repository(repo, builders)
    exported = optimize(repo, "exported", "--min-speedup", "0", report=tmp_path / "e.json")
    assert exported.code == 3
    quantised = candidate(exported, "int8-dynamic")
    assert quantised["status"] == "failed"
    assert quantised["reason"].startswith("cannot be built: a torch.export program has no eager")
    export = candidate(exported, "onnx-export")
    if importlib.util.find_spec("onnxscript") is None:
        assert export["reason"] == (
            "cannot be built: exporting a torch.export program to ONNX needs torch's dynamo "
            "exporter, which needs onnxscript (pip install onnxscript)"
        )
    indexed = optimize(repo, "ts_indexed", "--min-speedup", "0", report=tmp_path / "i.json")
    assert indexed.code == 3
    assert candidate(indexed, "int8-dynamic")["reason"] == (
        "cannot be built: the model has no Linear layer that dynamic quantisation handles"
    )
    export = candidate(indexed, "onnx-export")
    assert export["status"] == "measured"
    outputs = {o["name"]: o for o in export["accuracy"]["outputs"]}
    assert set(outputs) == {"OUTPUT__0", "OUTPUT__1"}
    assert all(o["kind"] == "exact" and o["agreement"] == 1.0 for o in outputs.values())
    assert "cannot be a version of this TorchScript model" in export["reason"]
