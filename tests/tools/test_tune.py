"""`inferd tune` against a real inferd server: sweeps of two to four candidates, each measured
for half a second. Assertions are on structure (rows, picks, configs), never on speed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd_tools.tune.main import main
from tests.support.models import build_good_repository
from tests.support.servers import RunningServer, run_server
from tests.support.tune_runs import served_config, tune_args

SHORT = ["--warmup-s", "0.2", "--duration-s", "0.5", "--concurrency", "4"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tune_repo")
    build_good_repository(path)
    return path


@pytest.fixture(scope="module")
def admin_server(repo: Path) -> Iterator[RunningServer]:
    with run_server(repo, admin_api=True) as running:
        yield running


def rows(stdout: str) -> list[list[str]]:
    """The table's candidate rows, split into cells (the note may hold spaces)."""
    return [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]


def test_sweep_reports_picks_writes_and_restores(
    admin_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = served_config(admin_server, "mlp")
    out = tmp_path / "config.pbtxt"
    args = tune_args(
        "mlp",
        "-u",
        admin_server.url,
        "--max-batch-sizes",
        "1,8",
        "--delays-us",
        "0",
        "--instances",
        "1",
        "--p99-ms",
        "100000",
        "--write-config",
        str(out),
        *SHORT,
    )
    assert main(args) == 0
    stdout = capsys.readouterr().out
    table = rows(stdout)
    assert [r[1] for r in table] == ["1", "8"]  # both candidates, by max_batch_size
    assert all(r[10] == "yes" for r in table)  # within budget, after avg batch and pad %
    best = [r for r in table if r[-1] == "best"]
    assert len(best) == 1
    assert f"best: max_batch_size={best[0][1]} delay_us=0 instances=1" in stdout

    written = mc.ModelConfig()
    text_format.Parse(out.read_text(), written)
    assert written.name == "mlp"
    assert written.max_batch_size == int(best[0][1])
    assert written.dynamic_batching.max_queue_delay_microseconds == 0
    assert [g.count for g in written.instance_group] == [1]
    assert "model_checksum" not in written.parameters

    assert served_config(admin_server, "mlp") == original


def test_a_candidate_that_fails_to_load_is_skipped_with_its_branch(
    admin_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    original = served_config(admin_server, "mlp")
    args = tune_args(
        "mlp",
        "-u",
        admin_server.url,
        "--max-batch-sizes",
        "1,8",
        "--delays-us",
        "0",
        "--instances=-1,1",  # the server rejects a negative instance count
        *SHORT,
    )
    assert main(args) == 0
    captured = capsys.readouterr()
    table = {(r[1], r[3]): " ".join(r[4:]) for r in rows(captured.out)}
    assert set(table) == {("1", "-1"), ("8", "-1"), ("1", "1"), ("8", "1")}
    assert "load failed" in table[("1", "-1")]
    assert "instance_group.count" in table[("1", "-1")]
    assert "skipped" in table[("8", "-1")]  # a bigger batch in the failed branch
    assert "load failed" in captured.err
    measured = [table[("1", "1")], table[("8", "1")]]
    assert all("failed" not in m and "skipped" not in m for m in measured)
    assert served_config(admin_server, "mlp") == original


def test_admin_api_off_exits_2_with_a_clear_message(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with run_server(repo, admin_api=False) as server:
        original = served_config(server, "mlp")
        args = tune_args("mlp", "-u", server.url, "--max-batch-sizes", "1", *SHORT)
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "403" in err and "--admin-api on" in err
        assert served_config(server, "mlp") == original


def test_bad_grid_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(tune_args("mlp", "--max-batch-sizes", "0,8")) == 2
    assert "--max-batch-sizes" in capsys.readouterr().err
