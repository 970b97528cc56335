"""Hot swaps of models of realistic weight, under load: the harness behind
tests/integration/repository/test_swap_memory.py and benchmarks/swap_memory.py.

Two models swap together: `weights`, an ONNX chain of MatMuls holding 64 MiB of FP32
initializers, and `holder`, a Python model holding 64 MiB in 1 MiB arrays (a state dict of
many layers: the sizes that land in the C heap once glibc's mmap threshold has moved). A swap
moves version N+1 of both into the repository, one rename per model; the server (poll mode)
loads it beside version N, switches, and releases N; the harness waits on the server's own log
line for each release (`event=memory_released`), never on the clock.
"""

from __future__ import annotations

import contextlib
import json
import os
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
# The swap test's bound: resident memory after 20 swaps at most this times the baseline.
# Measured +1.1-2.1% (docs/benchmarks.md); a leak of 2 MiB a swap and process ends +18%.
GROWTH_BOUND = 1.10
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

LEAK_MIB = 0

class Model:
    def load(self, context):
        self.version = float(context.version)
        rng = np.random.default_rng(int(context.version))
        # Touched pages (random, not zeros): resident, as real weights are.
        self.weights = [rng.random(1 << 18, dtype=np.float32) for _ in range({HOLDER_ARRAYS})]
        if LEAK_MIB:  # a deliberate leak: state kept in a module that outlives the version
            np.__dict__.setdefault("_swap_test_leak", []).append(
                rng.random(LEAK_MIB << 18, dtype=np.float32)
            )

    def predict(self, inputs):
        x = inputs["IN"]
        return {{"OUT": np.full(x.shape, self.version, dtype=np.float32)}}
"""


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


def write_repository(repo: Path, isolation: str = "thread", leak_mib: int = 0) -> None:
    """Version 1 of both models, and the files every version links to (in `repo`'s sibling
    folder `staging`). `leak_mib`: each load of the Python model keeps that much memory for
    good, in the model's process (a leak, to show that the swap test catches one)."""
    staging = _staging(repo)
    staging.mkdir()
    for seed in (0, 1):
        # Two weight sets, alternating: each version differs from the one it replaces, and
        # the harness does not spend a third of a second building 64 MiB per swap.
        (staging / f"weights-{seed}.onnx").write_bytes(weights_model(seed))
    (staging / "holder.py").write_text(
        HOLDER_PY.replace("LEAK_MIB = 0", f"LEAK_MIB = {leak_mib}", 1)
    )
    for name, config in (
        ("weights", WEIGHTS_CONFIG),
        ("holder", HOLDER_CONFIG.format(isolation=isolation)),
    ):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    write_version(repo, 1)


def _staging(repo: Path) -> Path:
    return repo.parent / "staging"


def write_version(repo: Path, version: int) -> None:
    """Version `version` of both models: one rename per model, of a folder holding a hard
    link to its file in `staging` (no copy: the repository grows by a folder a swap).

    One change per model per swap, never two: earlier versions stay (the default version
    policy serves the latest only). A swap that also removed an old version was two changes,
    and a poll that fell between them took a fingerprint without the new version, loaded it
    all the same, and so saw a change again at its next round: a pass that read the 64 MiB
    model once more after the swap, its RSS up to ~200 MiB over the baseline for about a
    second. On a busy machine that pass could still run when the test read the memory
    (+28% with --workers 2 in the full suite; docs/benchmarks.md)."""
    for name, file, source in (
        ("weights", "model.onnx", f"weights-{version % 2}.onnx"),
        ("holder", "model.py", "holder.py"),
    ):
        tmp = _staging(repo) / f"{name}-{version}"
        tmp.mkdir()
        os.link(_staging(repo) / source, tmp / file)
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
