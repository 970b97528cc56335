"""The `inferd` command as a user runs it: help text, and serving the example repository."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.models import build_example_repository
from tests.support.servers import CliServer, free_port, run_cli_server


def _inferd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", *args], capture_output=True, text=True, timeout=60
    )


def test_help_explains_every_option() -> None:
    top = _inferd("--help")
    assert top.returncode == 0
    assert "serve" in top.stdout
    serve = _inferd("serve", "--help")
    assert serve.returncode == 0
    for option in (
        "--model-repository",
        "--host",
        "--http-port",
        "--log-level",
        "--max-request-mib",
    ):
        assert option in serve.stdout


def _option_entries(help_text: str) -> dict[str, str]:
    """`--help` output cut into one entry per option: its first line starts '  -'."""
    entries: dict[str, str] = {}
    current = ""
    for line in help_text.splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = ""
        if current:
            entries[current] += " " + line.strip()
    return entries


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("serve", {"--http-port": "(default: 8000)", "--max-inflight-requests": "(default: 0)"}),
        ("bench", {"--window-s": "(default: 5.0)", "-i": "(default: http)"}),
        ("tune", {"--max-batch-sizes": "(default: 1,8,32)", "--concurrency": "(default: 8)"}),
    ],
)
def test_help_says_each_default_once(command: str, shown: dict[str, str]) -> None:
    """An option whose help already says its default gets no second '(default: ...)', and
    empty defaults (None, '', [], a flag's False) are not printed."""
    result = _inferd(command, "--help")
    assert result.returncode == 0, result.stderr
    entries = _option_entries(result.stdout)
    assert len(entries) > 5, result.stdout
    for option, entry in entries.items():
        assert entry.lower().count("default") <= 1, f"{option}: {entry}"
        for empty in ("(default: )", "(default: None)", "(default: [])", "(default: False)"):
            assert empty not in entry, f"{option}: {entry}"
    for option, default in shown.items():
        assert default in entries[option], entries[option]


def test_missing_repository_is_a_clear_error(tmp_path: Path) -> None:
    result = _inferd("serve", "--model-repository", str(tmp_path / "none"))
    assert result.returncode == 2
    assert "is not a directory" in result.stderr


@pytest.fixture(scope="module")
def example_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, CliServer]]:
    root = tmp_path_factory.mktemp("examples")
    repo = build_example_repository(root / "models")
    grpc_port = free_port()
    with run_cli_server(repo, root / "server.log", "--grpc-port", str(grpc_port)) as server:
        yield server.url.removeprefix("http://"), f"127.0.0.1:{grpc_port}", server


def test_serves_the_example_models(example_server: tuple[str, str, CliServer]) -> None:
    address, _, _ = example_server
    client = httpclient.InferenceServerClient(address)
    assert client.is_server_ready()
    x = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
    inp = httpclient.InferInput("input", [3, 64], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp])
    assert result.as_numpy("probabilities").shape == (3, 16)
    np.testing.assert_allclose(result.as_numpy("probabilities").sum(axis=1), 1, rtol=1e-5)
    assert (
        result.as_numpy("label").ravel().tolist()
        == result.as_numpy("probabilities").argmax(1).tolist()
    )

    text = httpclient.InferInput("text", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([["héllo"], ["ab"], ["grüße"]], dtype=object))
    stats = client.infer("text_stats", [text])
    # Upper-casing may lengthen a string (ß -> SS): nothing is cut to the input's width.
    assert [v.decode() for v in stats.as_numpy("upper").ravel()] == ["HÉLLO", "AB", "GRÜSSE"]
    assert stats.as_numpy("length").ravel().tolist() == [5, 2, 5]

    config = client.get_model_config("linear_noconfig")
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["x"]
    lin = httpclient.InferInput("x", [2, 4], "FP32")
    lin.set_data_from_numpy(np.ones((2, 4), np.float32))
    assert client.infer("linear_noconfig", [lin]).as_numpy("y").shape == (2, 2)

    # The TorchScript twin of the MLP has the same weights: the same answers.
    torch_result = client.infer("mlp_torch", [inp])
    np.testing.assert_allclose(
        torch_result.as_numpy("probabilities"), result.as_numpy("probabilities"), atol=1e-5
    )
    assert torch_result.as_numpy("label").tolist() == result.as_numpy("label").tolist()

    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    pair = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    pair[0].set_data_from_numpy(a)
    pair[1].set_data_from_numpy(b)
    add_sub = client.infer("add_sub", pair)
    np.testing.assert_array_equal(add_sub.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(add_sub.as_numpy("OUTPUT1"), a - b)
    client.close()

    # The decoupled example streams one response per word.
    body = {"text_input": "one two three"}
    with httpx.stream(
        "POST", f"http://{address}/v2/models/word_stream/generate_stream", json=body
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert [json.loads(line[6:])["text_output"] for line in lines] == ["one", "two", "three"]


def test_serves_the_recall_rank_ensemble(example_server: tuple[str, str, CliServer]) -> None:
    """recall -> rank -> topk as one request answers what the three give one by one."""
    _, grpc_address, _ = example_server
    client = grpcclient.InferenceServerClient(grpc_address)
    users = np.random.default_rng(5).normal(size=(4, 64)).astype(np.float32)

    def infer(model: str, **tensors: np.ndarray) -> Any:
        inputs = []
        for name, value in tensors.items():
            datatype = "INT64" if value.dtype == np.int64 else "FP32"
            inputs.append(grpcclient.InferInput(name, list(value.shape), datatype))
            inputs[-1].set_data_from_numpy(value)
        return client.infer(model, inputs)

    whole = infer("recall_rank", USER=users)
    recalled = infer("recall", USER=users)
    vecs = recalled.as_numpy("CANDIDATE_VECS")
    scores = infer("rank", USER=users, CANDIDATE_VECS=vecs).as_numpy("SCORES")
    best = infer("topk", CANDIDATES=recalled.as_numpy("CANDIDATES"), SCORES=scores)
    assert whole.as_numpy("IDS").shape == (4, 10)
    np.testing.assert_array_equal(whole.as_numpy("IDS"), best.as_numpy("IDS"))
    np.testing.assert_array_equal(whole.as_numpy("SCORES"), best.as_numpy("TOP_SCORES"))
    client.close()


def test_serves_over_grpc_too(example_server: tuple[str, str, CliServer]) -> None:
    _, grpc_address, _ = example_server
    client = grpcclient.InferenceServerClient(grpc_address)
    assert client.is_server_ready()
    inp = grpcclient.InferInput("input", [2, 64], "FP32")
    inp.set_data_from_numpy(np.ones((2, 64), np.float32))
    result = client.infer("mlp", [inp])
    assert result.as_numpy("probabilities").shape == (2, 16)
    client.close()


def test_sigterm_exits_cleanly_and_logs(
    example_server: tuple[str, str, CliServer],
) -> None:
    _, _, server = example_server
    assert server.stop() == 0
    output = server.output()
    assert "loaded model mlp version 1" in output
    # mlp's config sets Triton's delay, which the default policy reads as an upper bound: said
    # once, with the setting that gives Triton's behaviour; add_sub sets none.
    assert output.count("model mlp version 1: notice: dynamic_batching.max_queue_delay") == 1
    assert "parameters.batching_policy `window` does that" in output
    assert "model add_sub version 1: notice" not in output
    assert "HTTP server listening on http://127.0.0.1:" in output
    assert "gRPC server listening on 127.0.0.1:" in output
    assert "text_stats loaded from 1" in output  # the model's print, in the log
    assert "shutdown complete" in output
