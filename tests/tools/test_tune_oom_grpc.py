"""`inferd tune` against a real inferd server: out-of-memory branches, and measuring over gRPC.

The out-of-memory models really fail to allocate: past K rows they ask numpy for more memory
than any machine has, and numpy raises its own MemoryError ("Unable to allocate ..."). Each
sweep has two or three candidates measured for half a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd_tools.tune.errors import TuneError
from inferd_tools.tune.main import main, settings_from_args
from inferd_tools.tune.sweep import is_out_of_memory
from tests.support.fault_models import param, write_model
from tests.support.models import build_good_repository
from tests.support.servers import RunningServer, run_server
from tests.support.tune_runs import served_config, tune_args

SHORT = ["--warmup-s", "0.2", "--duration-s", "0.5"]
ROWS_THAT_FIT = 2  # K: a batch (or a max_batch_size) of more rows runs out of memory

# Fails to allocate for a batch of more than `rows_that_fit` rows; with `oom_at: "load"`,
# already in load() when max_batch_size is bigger than that (a model sizing its buffers for
# the largest batch). The sleep lets requests queue up, so batches fill to max_batch_size.
OOM_PY = """
import time
import numpy as np

class Model:
    def load(self, context):
        self.rows = int(context.parameters["rows_that_fit"])
        self.delay_s = float(context.parameters.get("delay_ms", "0")) / 1000
        if context.parameters.get("oom_at") == "load":
            self.buffers = self.scratch(context.max_batch_size)

    def scratch(self, rows):
        # 2**53 bytes a row past the rows that fit: no machine has it, so the allocation fails.
        width = 2**50 if rows > self.rows else 1
        return np.empty((rows, width), dtype=np.float64)

    def predict(self, inputs):
        x = inputs["IN"]
        time.sleep(self.delay_s)
        self.scratch(x.shape[0])
        return {"OUT": x.copy()}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tune_oom_repo")
    build_good_repository(path)
    fits = param("rows_that_fit", ROWS_THAT_FIT)
    batching = "dynamic_batching { }\n"
    write_model(path, "oom_batch", OOM_PY, batching + fits + param("delay_ms", 5), 2)
    write_model(path, "oom_load", OOM_PY, batching + fits + param("oom_at", "load"), 2)
    return path


@pytest.fixture(scope="module")
def admin_server(repo: Path) -> Iterator[RunningServer]:
    with run_server(repo, admin_api=True) as running:
        yield running


def notes(stdout: str) -> dict[str, str]:
    """max_batch_size -> the rest of its table row from the preferred column on (the note may
    hold spaces): one delay, instance count and preferred setting per sweep here."""
    rows = [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]
    return {r[1]: " ".join(r[4:]) for r in rows}


def sweep_sizes(server: RunningServer, model: str, sizes: str, *extra: str) -> list[str]:
    return [
        model, "-u", server.url, "--max-batch-sizes", sizes, "--delays-us", "0",
        "--instances", "1", *SHORT, *extra,
    ]  # fmt: skip


def test_requests_out_of_memory_stop_the_branch(
    admin_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    original = served_config(admin_server, "oom_batch")
    # Concurrency 8 against a model taking 5 ms a batch: batches fill up to max_batch_size,
    # so 4 rows (more than K) are sure to come, and run out of memory.
    args = tune_args(*sweep_sizes(admin_server, "oom_batch", "2,4,8", "--concurrency", "8"))
    assert main(args) == 0  # max_batch_size 2 was measured and is the best
    captured = capsys.readouterr()
    table = notes(captured.out)
    assert set(table) == {"2", "4", "8"}
    assert table["2"].endswith("best") and "yes" in table["2"]
    assert "out of memory" in table["4"] and "Unable to allocate" in table["4"]
    assert "skipped" in table["8"] and "max_batch_size 4 ran out of memory" in table["8"]
    assert (
        "out of memory at max_batch_size 4; skipping bigger max_batch_size in this branch"
        in captured.err
    )
    assert "best: max_batch_size=2 " in captured.out
    assert served_config(admin_server, "oom_batch") == original


def test_a_load_out_of_memory_stops_the_branch(
    admin_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    original = served_config(admin_server, "oom_load")
    args = tune_args(*sweep_sizes(admin_server, "oom_load", "1,4,8", "--concurrency", "2"))
    assert main(args) == 0
    captured = capsys.readouterr()
    table = notes(captured.out)
    assert table["1"].endswith("best")
    assert "out of memory" in table["4"] and "Unable to allocate" in table["4"]
    assert "skipped" in table["8"]
    assert "out of memory at max_batch_size 4;" in captured.err
    assert served_config(admin_server, "oom_load") == original


@pytest.mark.parametrize(
    "message",
    [
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "Failed to allocate memory for requested buffer of size 1073741824",
        "std::bad_alloc",
        "MemoryError: cannot fit the batch",
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA error: OUT OF MEMORY",
    ],
)
def test_out_of_memory_messages_are_recognised(message: str) -> None:
    assert is_out_of_memory(message)


def test_other_errors_are_not_out_of_memory() -> None:
    assert not is_out_of_memory("model 'm': negative input is not allowed")
    assert not is_out_of_memory("instance_group.count must be at least 1")


def test_measuring_over_grpc(
    admin_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    original = served_config(admin_server, "mlp")
    args = tune_args(
        *sweep_sizes(admin_server, "mlp", "1,8", "--concurrency", "4"),
        "-i",
        "grpc",
        "--grpc-url",
        admin_server.grpc_address,
        "--p99-ms",
        "100000",
    )
    assert main(args) == 0
    captured = capsys.readouterr()
    table = notes(captured.out)
    assert set(table) == {"1", "8"}
    assert all("yes" in note for note in table.values())
    assert "measuring over grpc" in captured.err
    assert served_config(admin_server, "mlp") == original


def test_an_unreachable_grpc_address_exits_2_before_any_load(
    admin_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with admin_server.client() as c:
        before = c.post("/v2/repository/index").json()
    args = tune_args(
        *sweep_sizes(admin_server, "mlp", "1"), "-i", "grpc", "--grpc-url", "127.0.0.1:1"
    )
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--grpc-url" in err and "127.0.0.1:1" in err
    with admin_server.client() as c:
        assert c.post("/v2/repository/index").json() == before


def test_grpc_url_defaults_to_the_http_port_plus_one() -> None:
    settings = settings_from_args(tune_args("mlp", "-u", "10.0.0.5:9000", "-i", "grpc"))
    assert settings.url == "http://10.0.0.5:9000" and settings.grpc_url == "10.0.0.5:9001"
    settings = settings_from_args(tune_args("mlp", "-i", "grpc", "--grpc-url", "h:5"))
    assert settings.grpc_url == "h:5" and settings.measure_url == "h:5"
    with pytest.raises(TuneError, match="-i grpc"):
        settings_from_args(tune_args("mlp", "--grpc-url", "h:5"))
