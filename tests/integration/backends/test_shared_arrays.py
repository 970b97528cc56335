"""`inferd.shared_array`: one copy of a model's large read-only table, whatever the number of
instances, in the server's threads or in worker processes of their own.

Three process-isolated instances of `table` map one 64 MiB segment: the PSS of the server
and its workers is about two copies below the same model building its table privately in
each instance. The answers read the table (over HTTP and gRPC, from the case-table client)
for inferd's `Model` and Triton's `TritonPythonModel` in worker processes and for a `Model`
in the server's threads; the table cannot be written, a killed worker's restart maps it
again, a killed server leaves nothing mapped or held anywhere, unload releases the segment,
and a wrong build or a name asked for with two layouts fails the load naming the array.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.backends.python.isolated.isolated_instance import ProcessInstance
from inferd.errors import InferdError
from tests.support.async_infer import OK, PROTOCOLS, AsyncInfer
from tests.support.servers import RunningServer, batcher_of, run_cli_server, run_server

ROWS, COLS = 4096, 4096  # float32: 64 MiB
TABLE_BYTES = ROWS * COLS * 4

# OUT = table[IN, 7], where table[i, j] = i * COLS + j (exact in float32 below 2**24).
TABLE_PY = f"""
import numpy as np
import inferd

ROWS, COLS = {ROWS}, {COLS}


def build():
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


class Model:
    def load(self, context):
        if context.parameters.get("private") == "1":
            self.table = build()  # the control: a copy per instance
        else:
            self.table = inferd.shared_array("table", (ROWS, COLS), np.float32, build=build)
            try:
                self.table[0, 0] = -1.0
            except ValueError:
                pass
            else:
                raise RuntimeError("the shared table was writable")
        # Every instance reads every page, so each maps the whole table (PSS counts it).
        self.total = float(self.table.sum(dtype=np.float64))

    def predict(self, inputs):
        rows = inputs["IN"][:, 0].astype(np.int64)
        return {{"OUT": self.table[rows, 7:8]}}
"""

# Triton's API, in two worker processes, one table.
TRITON_TABLE_PY = """
import numpy as np
import inferd
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.table = inferd.shared_array(
            "table", [64, 16], "float32",
            build=lambda: np.arange(64 * 16, dtype=np.float32).reshape(64, 16),
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[:, 0]
            out = self.table[rows.astype(np.int64), 7:8]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

# inferd's API in the server's threads: two instances, one table.
THREAD_TABLE_PY = """
import numpy as np
import inferd


class Model:
    def load(self, context):
        self.table = inferd.shared_array(
            "table", [64, 16], "float32",
            build=lambda: np.arange(64 * 16, dtype=np.float32).reshape(64, 16),
        )

    def predict(self, inputs):
        return {"OUT": self.table[inputs["IN"][:, 0].astype(np.int64), 7:8]}
"""

WRONG_BUILD_PY = """
import numpy as np
import inferd


class Model:
    def load(self, context):
        inferd.shared_array("weights", (8, 4), np.float32, build=lambda: np.zeros((4, 8)))

    def predict(self, inputs):
        return {"OUT": inputs["IN"]}
"""

# The second instance asks for the first one's array with another shape.
TWO_LAYOUTS_PY = """
import numpy as np
import inferd


class Model:
    def load(self, context):
        rows = 8 + context.instance_index
        inferd.shared_array(
            "weights", (rows, 4), np.float32, build=lambda: np.zeros((rows, 4), np.float32)
        )

    def predict(self, inputs):
        return {"OUT": inputs["IN"]}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
{parameters}
"""
PROCESS = 'parameters { key: "isolation" value: { string_value: "process" } }'
PRIVATE = 'parameters { key: "private" value: { string_value: "1" } }'


def _write(repo: Path, name: str, code: str, count: int, *parameters: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    config = CONFIG.format(name=name, count=count, parameters="\n".join(parameters))
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("shared_arrays")
    _write(repo, "table", TABLE_PY, 3, PROCESS)
    _write(repo, "private_table", TABLE_PY, 3, PROCESS, PRIVATE)
    _write(repo, "triton_table", TRITON_TABLE_PY, 2, PROCESS)
    _write(repo, "thread_table", THREAD_TABLE_PY, 2)
    _write(repo, "wrong_build", WRONG_BUILD_PY, 1, PROCESS)
    _write(repo, "two_layouts", TWO_LAYOUTS_PY, 2)
    with run_server(repo, model_control_mode="explicit", load_models=("*",)) as running:
        yield running


def _worker_pids(server: RunningServer, model: str) -> list[int]:
    instances: list[Any] = batcher_of(server, model)._instances  # type: ignore[attr-defined]
    pids = [inst.pid for inst in instances if isinstance(inst, ProcessInstance)]
    assert len(pids) == len(instances) and None not in pids
    return [p for p in pids if p is not None]


def _pss_bytes(pid: int) -> int:
    """The process's proportional set size: shared pages divided among their mappers."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no Pss in /proc/{pid}/smaps_rollup")


def _segment_pss_bytes(pid: int, label: str) -> int:
    """The PSS of the process's mappings of the memfd named `label`."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = label in line
        elif inside and line.startswith("Pss:"):
            total += int(fields[1]) * 1024
    return total


def _memfds(label: str) -> list[str]:
    """This process's (the server's) descriptors of memfds named `label`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (listdir's own descriptor)
            continue
        if label in target:
            found.append(target)
    return found


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["table", "triton_table", "thread_table"])
def test_the_answers_read_the_shared_table(
    server: RunningServer, protocol: str, model: str
) -> None:
    cols = COLS if model == "table" else 16

    async def ask() -> None:
        async with AsyncInfer(protocol, server) as infer:
            for row in (0, 1, 63):
                reply = await infer(model, float(row))
                assert reply.status == OK[protocol], reply.message
                assert reply.data == [row * cols + 7]

    asyncio.run(ask())


def test_three_isolated_instances_hold_one_copy(server: RunningServer) -> None:
    shared, private = _worker_pids(server, "table"), _worker_pids(server, "private_table")
    assert len(shared) == len(private) == 3
    server_pss = _pss_bytes(os.getpid())  # the server maps none of it: it holds the fd
    shared_total = server_pss + sum(_pss_bytes(p) for p in shared)
    private_total = server_pss + sum(_pss_bytes(p) for p in private)
    # Three private copies against one shared: the difference is about two copies.
    assert private_total - shared_total > 1.5 * TABLE_BYTES, (shared_total, private_total)
    # The segment itself: every worker maps all of it, and the PSS of those mappings sums
    # to one copy (each worker is charged a third).
    segment = [_segment_pss_bytes(p, "inferd-array:table/1:table") for p in shared]
    assert all(s > 0.2 * TABLE_BYTES for s in segment), segment
    assert 0.9 * TABLE_BYTES < sum(segment) < 1.1 * TABLE_BYTES, segment


def test_a_build_of_the_wrong_shape_or_two_layouts_fail_the_load_naming_the_array(
    server: RunningServer,
) -> None:
    with server.client() as c:
        rows = {row["name"]: row for row in c.post("/v2/repository/index").json()}
    assert rows["wrong_build"]["state"] == "UNAVAILABLE"
    assert (
        "inferd.shared_array('weights'): build() returned shape [4, 8] float64, not the "
        "declared shape [8, 4] float32" in rows["wrong_build"]["reason"]
    )
    assert rows["two_layouts"]["state"] == "UNAVAILABLE"
    assert (
        "shared array 'weights' of model 'two_layouts' version 1 exists with shape [8, 4] "
        "float32; this call asks for shape [9, 4] float32" in rows["two_layouts"]["reason"]
    )
    # Their segments went with the failed loads.
    assert not _memfds("inferd-array:wrong_build/") and not _memfds("inferd-array:two_layouts/")
    names = ["table/1:table", "thread_table/1:table", "triton_table/1:table"]
    assert server.server.model_host.arrays.names() == names


def test_a_killed_worker_maps_the_table_again_when_restarted(server: RunningServer) -> None:
    instances: list[Any] = batcher_of(server, "table")._instances  # type: ignore[attr-defined]
    first = instances[0]  # the one that built it
    killed = first.pid
    os.kill(killed, signal.SIGKILL)
    batch = {"IN": np.array([[5.0]], np.float32)}
    try:  # it may still look alive: then this batch finds it dead and fails
        first.execute(batch)
    except InferdError as exc:
        assert "died (killed by signal SIGKILL)" in exc.message
    # The next batch waits for the restarted worker, which mapped the segment the server
    # kept (its load checks it is read-only), and answers from it.
    assert first.execute(batch)["OUT"].tolist() == [[5 * COLS + 7]]
    assert first.pid != killed and first.restarts == 1
    assert server.server.model_host.arrays.names().count("table/1:table") == 1
    assert len(_memfds("inferd-array:table/1:table")) == 1


def test_unload_releases_the_segment(server: RunningServer) -> None:
    # Last: it unloads the module's model.
    label = "inferd-array:table/1:table"
    assert len(_memfds(label)) == 1
    shm_before = set(os.listdir("/dev/shm"))
    pids = _worker_pids(server, "table")
    with server.client() as c:
        assert c.post("/v2/repository/models/table/unload").status_code == 200
    assert not _memfds(label)
    assert "table/1:table" not in server.server.model_host.arrays.names()
    for pid in pids:  # the workers, whose mappings held the pages, are gone
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
    assert set(os.listdir("/dev/shm")) <= shm_before  # nothing was ever named there


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _holders(label: str) -> list[str]:
    """Every process that maps or holds a descriptor of a memfd named `label`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if label in Path(f"/proc/{entry}/maps").read_text():
                found.append(f"{entry} maps it")
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if label in os.readlink(f"/proc/{entry}/fd/{fd}"):
                    found.append(f"{entry} holds fd {fd}")
        except OSError:  # gone meanwhile
            continue
    return found


def test_a_killed_server_leaves_no_segment_behind(tmp_path: Path) -> None:
    """SIGKILL of the server: its workers see their pipe close and exit, and with them the
    last mapping of the segment; nothing was ever named in /dev/shm."""
    name = f"killed_server_{os.getpid()}"  # unique on this machine: the scan sees them all
    code = TABLE_PY.replace(f"ROWS, COLS = {ROWS}, {COLS}", "ROWS, COLS = 256, 256")
    _write(tmp_path / "repo", name, code, 2, PROCESS)
    label = f"inferd-array:{name}/1:table"
    shm_before = set(os.listdir("/dev/shm"))
    with run_cli_server(tmp_path / "repo", tmp_path / "server.log") as server:
        children = _children(server.proc.pid)  # the workers (and multiprocessing's tracker)
        assert len(children) >= 2, server.output()
        assert len(_holders(label)) >= 3  # the server's descriptor, each worker's mapping
        waits = [os.pidfd_open(pid) for pid in children]
        server.proc.kill()
        server.proc.wait()
        try:
            for fd in waits:  # readable once that process has exited
                assert select.select([fd], [], [], 60)[0], "a child outlived its server"
        finally:
            for fd in waits:
                os.close(fd)
    assert _holders(label) == []
    assert set(os.listdir("/dev/shm")) <= shm_before


def test_outside_a_server_it_builds_a_read_only_array() -> None:
    import inferd

    table = inferd.shared_array("t", 4, "int32", build=lambda: np.arange(4, dtype=np.int32))
    assert table.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="read-only"):
        table[0] = 9
