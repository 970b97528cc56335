"""Hot swaps of models of realistic weight, under load: the harness behind
tests/integration/repository/test_swap_memory.py and benchmarks/swap_memory.py.

Two models swap together: `weights`, an ONNX chain of MatMuls holding 64 MiB of FP32
initializers, and `holder`, a Python model holding 64 MiB in 1 MiB arrays (a state dict of
many layers: the sizes that land in the C heap once glibc's mmap threshold has moved). A swap
writes version N+1 of both through a staging folder, the server (poll mode) loads it beside
version N, switches, and releases N; the harness waits on the server's own log line for each
release (`event=memory_released`), never on the clock.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.support.server_process import free_port, wait_until_serving

WIDTH = 2048  # 16 MiB per FP32 layer
LAYERS = 4  # 64 MiB of weights per ONNX version
HOLDER_ARRAYS = 64  # 1 MiB each: 64 MiB per Python version
MODELS = ("weights", "holder")
DEADLINE_S = 120.0

WEIGHTS_CONFIG = f"""
name: "weights"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ {WIDTH} ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 1 ] }} ]
dynamic_batching {{ }}
"""

HOLDER_CONFIG = """
name: "holder"
backend: "python"
max_batch_size: 4
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "isolation" value: {{ string_value: "{isolation}" }} }}
"""

HOLDER_PY = f"""
import numpy as np

class Model:
    def load(self, context):
        self.version = float(context.version)
        rng = np.random.default_rng(int(context.version))
        # Touched pages (random, not zeros): resident, as real weights are.
        self.weights = [rng.random(1 << 18, dtype=np.float32) for _ in range({HOLDER_ARRAYS})]

    def predict(self, inputs):
        x = inputs["IN"]
        return {{"OUT": np.full(x.shape, self.version, dtype=np.float32)}}
"""


@functools.lru_cache(maxsize=2)
def weights_model(seed: int) -> bytes:
    """y = sum(x @ W1 @ ... @ W_LAYERS): LAYERS initializers of WIDTH x WIDTH FP32."""
    rng = np.random.default_rng(seed)
    nodes, inits, last = [], [], "x"
    for i in range(LAYERS):
        w = rng.random((WIDTH, WIDTH), dtype=np.float32)
        w -= 0.5
        w /= WIDTH  # keeps the chain's outputs near 1
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.tobytes(), raw=True))
        nodes.append(helper.make_node("MatMul", [last, f"w{i}"], [f"h{i}"]))
        last = f"h{i}"
    nodes.append(helper.make_node("ReduceSum", [last], ["y"], keepdims=1, axes=[1]))
    graph = helper.make_graph(
        nodes,
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    return model.SerializeToString()


def write_repository(repo: Path, isolation: str = "thread") -> None:
    """Version 1 of both models."""
    for name, config in (
        ("weights", WEIGHTS_CONFIG),
        ("holder", HOLDER_CONFIG.format(isolation=isolation)),
    ):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    write_version(repo, 1, repo.parent / "staging")


def write_version(repo: Path, version: int, staging: Path) -> None:
    """Version `version` of both models, each moved in whole (a poll never sees half a
    file). The version before the serving one (released by the last swap) is removed first:
    a poll that sees the removal alone reloads nothing, and one that sees both swaps."""
    staging.mkdir(exist_ok=True)
    for name, file, content in (
        # Two weight sets, alternating: each version differs from the one it replaces, and
        # the harness does not spend a third of a second building 64 MiB per swap.
        ("weights", "model.onnx", weights_model(version % 2)),
        ("holder", "model.py", HOLDER_PY.encode()),
    ):
        tmp = staging / f"{name}-{version}"
        tmp.mkdir()
        (tmp / file).write_bytes(content)
        shutil.rmtree(repo / name / str(version - 2), ignore_errors=True)
        tmp.rename(repo / name / str(version))


# -- memory of a process tree ----------------------------------------------------------


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found.extend(children)
                todo.extend(children)
    return found


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def spawned_children(pid: int) -> list[int]:
    """`pid`'s multiprocessing children (--workers processes), not its resource tracker."""
    return [
        p
        for p in descendants(pid)
        if parent(p) == pid and b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]


def tree_rss_bytes(pid: int) -> int:
    """RSS of `pid` and every process below it (model worker processes, --workers)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += rss_bytes(p)
    return total


# -- the server --------------------------------------------------------------------------


@dataclass
class SwapServer:
    """`inferd serve` in poll mode, JSON logs in a file."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    def log_events(self, event: str, reason: str = "") -> list[dict[str, Any]]:
        """The JSON log records of `event` (and `reason`), in order."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if f'"event":"{event}"' in line:
                record = json.loads(line)
                if not reason or record.get("reason") == reason:
                    out.append(record)
        return out

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """The sum of every sample of `name` (over the `worker` label, with --workers)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 (loopback)
            text = r.read().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        )

    def memory(self, workers: int) -> int:
        """process_resident_memory_bytes (summed over --workers) plus the RSS of the model
        worker processes below them, which no server process's own RSS includes."""
        exporters = [self.proc.pid] if workers == 1 else spawned_children(self.proc.pid)
        assert len(exporters) == workers, exporters
        below = sum(rss_bytes(p) for e in exporters for p in descendants(e))
        return int(self.metric("process_resident_memory_bytes")) + below

    def wait_unloads(self, count: int) -> None:
        """Until the server logged `count` releases of unloaded versions (one per model, swap
        and worker): the swaps are done, old versions closed and their memory given back."""
        deadline = time.monotonic() + DEADLINE_S
        while len(self.log_events("memory_released", "unloaded")) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{count} releases not logged within {DEADLINE_S:.0f} s:\n"
                    + self.output()[-4000:]
                )
            time.sleep(0.05)


@contextlib.contextmanager
def serve(
    repo: Path, log_path: Path, *args: str, python: tuple[str, ...] = ()
) -> Iterator[SwapServer]:
    """`python -m inferd serve` on free ports; `python` replaces the interpreter's argv
    (the benchmark's 'before' run patches the trim out that way)."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        *(python or (sys.executable, "-m", "inferd")), "serve",
        "--model-repository", str(repo), "--http-port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--model-control-mode", "poll", "--repository-poll-secs", "0.1",
        "--log-format", "json", "--log-level", "INFO", *args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = SwapServer(proc, http_port, grpc_port, metrics_port, log_path)
    try:
        # Our own process on the ports chosen now (never a stranger that took one), with
        # every worker listening.
        wait_until_serving(
            proc.pid,
            http_port,
            exit_code=proc.poll,
            output=lambda: server.output()[-4000:],
            timeout_s=DEADLINE_S,
            listeners=_workers(args),
        )
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait(timeout=30)


def _workers(args: tuple[str, ...]) -> int:
    return int(args[args.index("--workers") + 1]) if "--workers" in args else 1


# -- the load ------------------------------------------------------------------------------


@dataclass
class Load:
    """Client threads over HTTP and gRPC (tritonclient), each alternating between the two
    models until stopped; every answer is counted by (protocol, model, version)."""

    http_port: int
    grpc_port: int
    clients_per_protocol: int = 1
    # gRPC channels reach one --workers process each: more than one to reach both.
    answers: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for protocol in ("http", "grpc"):
            for _ in range(self.clients_per_protocol):
                t = threading.Thread(target=self._client, args=(protocol,), daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def total(self) -> int:
        with self._lock:
            return sum(self.answers.values())

    def wait_answers(self, count: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while self.total() < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} answers not reached: {self.answers} {self.failures}")
            time.sleep(0.01)

    def _client(self, protocol: str) -> None:
        lib = httpclient if protocol == "http" else grpcclient
        port = self.http_port if protocol == "http" else self.grpc_port
        client = lib.InferenceServerClient(f"127.0.0.1:{port}")
        x = lib.InferInput("x", [1, WIDTH], "FP32")
        x.set_data_from_numpy(np.ones((1, WIDTH), np.float32))
        holder_in = lib.InferInput("IN", [1, 1], "FP32")
        holder_in.set_data_from_numpy(np.ones((1, 1), np.float32))
        requests = {"weights": [x], "holder": [holder_in]}
        try:
            while not self._stop.is_set():
                for model in MODELS:
                    try:
                        result = client.infer(model, requests[model])
                    except Exception as exc:  # every failure is recorded, with its message
                        with self._lock:
                            self.failures.append(f"{protocol} {model}: {exc}")
                        continue
                    version = (
                        str(result.get_response()["model_version"])
                        if protocol == ("http")
                        else result.get_response().model_version
                    )
                    with self._lock:
                        self.answers[(protocol, model, version)] += 1
        finally:
            client.close()
