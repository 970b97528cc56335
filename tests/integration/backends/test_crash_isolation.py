"""Crash isolation: a Python model with `isolation: "process"` runs in a worker process of its
own; when that process dies, the batch fails with a message naming the crash, the worker is
restarted, and the server and its other models keep serving."""

from __future__ import annotations

import logging
import os
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext, SupervisedInstance
from inferd.backends.python.isolated.isolated_instance import ProcessInstance
from inferd.backends.python.python_backend import PythonBackend
from inferd.errors import ErrorKind, InferdError
from tests.support.servers import RunningServer, run_server

# OUT = IN * 2, PID = the worker's pid; an input of -1 kills the worker on the spot.
CRASHY_PY = """
import os
import numpy as np

class Model:
    def load(self, context):
        self.marker = context.parameters.get("unload_marker", "")
        self.fail_flag = context.parameters.get("fail_restart_flag", "")
        if self.fail_flag and os.path.exists(self.fail_flag):
            raise RuntimeError("cannot load twice")

    def predict(self, inputs):
        x = inputs["IN"]
        print(f"crashy predicting {x.shape[0]} rows in pid {os.getpid()}")
        if (x == -1).any():
            if self.fail_flag:
                open(self.fail_flag, "w").close()
            os._exit(1)
        return {"OUT": x * 2, "PID": np.full((x.shape[0], 1), os.getpid(), np.int64)}

    def unload(self):
        if self.marker:
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
"""

CRASHY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }}
]
parameters {{ key: "isolation" value: {{ string_value: "process" }} }}
{extra}
"""

STEADY_PY = """
import numpy as np

class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"] + 1}
"""

BAD_LOAD_PY = """
class Model:
    def load(self, context):
        raise RuntimeError("no weights in this folder")

    def predict(self, inputs):
        return {"OUT": inputs["IN"]}
"""

SIMPLE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
{extra}
"""

PROCESS = 'parameters { key: "isolation" value: { string_value: "process" } }'


def _write(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("crash_repo")
    _write(repo, "crashy", CRASHY_PY, CRASHY_CONFIG.format(name="crashy", extra=""))
    _write(repo, "steady", STEADY_PY, SIMPLE_CONFIG.format(name="steady", extra=""))
    _write(repo, "bad_load", BAD_LOAD_PY, SIMPLE_CONFIG.format(name="bad_load", extra=PROCESS))
    with run_server(repo) as server:
        yield server


def _infer(server: RunningServer, model: str, values: list[float]) -> Any:
    body = {
        "inputs": [{"name": "IN", "shape": [len(values), 1], "datatype": "FP32", "data": values}]
    }
    with server.client() as c:
        return c.post(f"/v2/models/{model}/infer", json=body)


def _outputs(response: Any) -> dict[str, list[Any]]:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


def _wait_ready(server: RunningServer, model: str) -> None:
    deadline = time.monotonic() + 60
    with server.client() as c:
        while c.get(f"/v2/models/{model}/ready").status_code != 200:
            assert time.monotonic() < deadline, f"{model} never became ready"
            time.sleep(0.05)


class _SteadyProbe:
    """Keeps asking the in-process model while a test runs; records every failure."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            r = _infer(self.server, "steady", [1.0])
            if r.status_code == 200 and _outputs(r)["OUT"] == [2.0]:
                self.answers += 1
            else:
                self.failures.append(f"{r.status_code}: {r.text}")
            time.sleep(0.01)

    def __enter__(self) -> _SteadyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_crash_fails_the_batch_restarts_the_worker_and_spares_other_models(
    crash_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    _wait_ready(crash_server, "crashy")
    _wait_ready(crash_server, "steady")
    with (
        caplog.at_level(logging.INFO, logger="inferd.model.crashy"),
        _SteadyProbe(crash_server) as probe,
    ):
        # (a) a normal request
        first = _outputs(_infer(crash_server, "crashy", [1.0, 2.5]))
        assert first["OUT"] == [2.0, 5.0]
        first_pid = first["PID"][0]
        assert first_pid != os.getpid()  # it really ran in another process

        # (b) the marked request kills the worker: HTTP 500 naming the crash
        crashed = _infer(crash_server, "crashy", [-1.0])
        assert crashed.status_code == 500
        message = crashed.json()["error"]
        assert "crashy" in message
        assert "worker process died (exit code 1) while executing this batch" in message
        assert "restarted" in message

        # (c) the next requests are served by a new worker
        again = _outputs(_infer(crash_server, "crashy", [3.0]))
        assert again["OUT"] == [6.0]
        assert again["PID"][0] != first_pid
        assert _outputs(_infer(crash_server, "crashy", [4.0]))["OUT"] == [8.0]

        # (e) prints in the worker reach the server's log, tagged with the model
        deadline = time.monotonic() + 30
        while not any(
            r.name == "inferd.model.crashy" and "crashy predicting 1 rows" in r.getMessage()
            for r in caplog.records
        ):
            assert time.monotonic() < deadline, "the worker's print never reached the log"
            time.sleep(0.05)
        record = next(r for r in caplog.records if r.name == "inferd.model.crashy")
        assert getattr(record, "model", None) == "crashy"

    # (d) the in-process model kept answering throughout
    assert probe.failures == []
    assert probe.answers > 0
    assert _outputs(_infer(crash_server, "steady", [5.0]))["OUT"] == [6.0]


def test_a_killed_worker_is_restarted(crash_server: RunningServer) -> None:
    _wait_ready(crash_server, "crashy")
    with _SteadyProbe(crash_server) as probe:
        pid = _outputs(_infer(crash_server, "crashy", [1.0]))["PID"][0]
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)  # (f) as the OOM killer would
        # The kill may land while idle (the next request waits for the restart) or race with
        # a request (that one fails naming the signal); either way a new worker answers.
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "no new worker answered after SIGKILL"
            r = _infer(crash_server, "crashy", [2.0])
            if r.status_code == 200:
                out = _outputs(r)
                if out["PID"][0] != pid:
                    assert out["OUT"] == [4.0]
                    break
            else:
                assert r.status_code == 500
                assert "worker process died (killed by signal SIGKILL)" in r.json()["error"]
            time.sleep(0.05)
    assert probe.failures == []


def test_a_failing_load_in_the_worker_marks_the_version_unavailable(
    crash_server: RunningServer,
) -> None:
    # (g) load() raising in the worker process fails the version with the model's reason
    with crash_server.client() as c:
        deadline = time.monotonic() + 60
        while True:
            rows = {row["name"]: row for row in c.post("/v2/repository/index").json()}
            if rows.get("bad_load", {}).get("state") == "UNAVAILABLE":
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.05)
        assert "no weights in this folder" in rows["bad_load"]["reason"]
        assert c.get("/v2/models/bad_load/ready").status_code != 200


# -- the instance on its own ------------------------------------------------------------------


def _context(tmp_path: Path, name: str, extra: str = "") -> LoadContext:
    _write(tmp_path, name, CRASHY_PY, CRASHY_CONFIG.format(name=name, extra=extra))
    config = text_format.Parse((tmp_path / name / "config.pbtxt").read_text(), mc.ModelConfig())
    return LoadContext(name, "1", tmp_path / name / "1", config, 0, 1)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_close_unloads_the_model_and_leaves_no_process(tmp_path: Path) -> None:
    marker = tmp_path / "unloaded"
    extra = f'parameters {{ key: "unload_marker" value: {{ string_value: "{marker}" }} }}'
    instance = PythonBackend().load(_context(tmp_path, "solo", extra))
    assert isinstance(instance, ProcessInstance)
    assert isinstance(instance, SupervisedInstance)
    assert instance.is_alive()
    out = instance.execute({"IN": np.array([[1.5]], np.float32)})
    np.testing.assert_array_equal(out["OUT"], [[3.0]])
    pid = int(out["PID"][0, 0])
    assert pid == instance.pid

    with pytest.raises(InferdError) as crash:
        instance.execute({"IN": np.array([[-1.0]], np.float32)})
    assert crash.value.kind is ErrorKind.MODEL_ERROR
    assert "exit code 1" in crash.value.message
    out = instance.execute({"IN": np.array([[2.0]], np.float32)})
    np.testing.assert_array_equal(out["OUT"], [[4.0]])
    assert instance.restarts == 1
    assert _pid_gone(pid)  # the dead worker was reaped
    pid = int(out["PID"][0, 0])

    instance.close()
    assert not instance.is_alive()
    assert _pid_gone(pid)
    assert marker.read_text() == str(pid)  # unload() ran in the worker


def test_a_failed_restart_fails_later_batches_and_reports_not_alive(tmp_path: Path) -> None:
    flag = tmp_path / "crashed-once"
    extra = f'parameters {{ key: "fail_restart_flag" value: {{ string_value: "{flag}" }} }}'
    instance = PythonBackend().load(_context(tmp_path, "once", extra))
    assert isinstance(instance, ProcessInstance)
    try:
        with pytest.raises(InferdError, match="died"):
            instance.execute({"IN": np.array([[-1.0]], np.float32)})
        with pytest.raises(InferdError) as later:
            instance.execute({"IN": np.array([[1.0]], np.float32)})
        assert later.value.kind is ErrorKind.UNAVAILABLE
        assert "could not be restarted" in later.value.message
        assert "cannot load twice" in later.value.message
        assert not instance.is_alive()
    finally:
        instance.close()


def test_an_unknown_isolation_is_a_config_error(tmp_path: Path) -> None:
    config = mc.ModelConfig(name="odd")
    config.input.add(name="IN")
    config.output.add(name="OUT")
    config.parameters["isolation"].string_value = "container"
    with pytest.raises(Exception, match="isolation 'container' is not supported"):
        PythonBackend().complete_config(config, tmp_path)


def test_a_dead_worker_makes_the_model_and_server_not_ready(tmp_path: Path) -> None:
    # The worker dies and cannot be restarted: readiness must say so, not "the process is up".
    flag = tmp_path / "crashed-once"
    extra = f'parameters {{ key: "fail_restart_flag" value: {{ string_value: "{flag}" }} }}'
    _write(tmp_path / "repo", "once", CRASHY_PY, CRASHY_CONFIG.format(name="once", extra=extra))
    _write(tmp_path / "repo", "steady", STEADY_PY, SIMPLE_CONFIG.format(name="steady", extra=""))
    with run_server(tmp_path / "repo") as server, server.client() as c:
        assert c.get("/v2/health/ready").status_code == 200
        assert _infer(server, "once", [-1.0]).status_code == 500
        deadline = time.monotonic() + 30
        while c.get("/v2/models/once/ready").status_code != 503:
            assert time.monotonic() < deadline, "a dead worker still reads as ready"
            time.sleep(0.05)
        assert c.get("/v2/health/ready").status_code == 503
        assert c.get("/v2/models/steady/ready").status_code == 200
