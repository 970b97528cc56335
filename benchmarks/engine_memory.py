"""Memory of `--workers N --engine` against one process: PSS summed over every process of the
server (supervisor, front ends, engine), from /proc/PID/smaps_rollup (docs/benchmarks.md,
"Memory: weights once").

    .venv/bin/python benchmarks/engine_memory.py [--big-only | --mlp-only] [--old]

Three repositories: the example MLP alone (examples/models/mlp, built by
examples/build_models.py), the whole of examples/models (torch among its backends),
and `big`, the same MLP shape widened to 64 -> 10240 -> 10240 -> 16 (about 420 MB of FP32
weights), built here into a temporary directory (never committed). Each design is started,
sent one request (so what a request touches is counted), measured, stopped. `--old` adds
today's `--workers N` (N whole servers) for comparison.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.support.models import builders as build_models  # noqa: E402  (examples/build_models.py)


def _load(name: str) -> ModuleType:
    """A sibling benchmark script, as a module (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine_hop = _load("engine_hop")  # its server start-up helper


def descendants(pid: int) -> list[int]:
    out, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out.append(child)
                todo.append(child)
    return out


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def infer_once(port: int) -> None:
    body = (
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,64],"data":['
        + b",".join(b"0.5" for _ in range(64))
        + b"]}]}"
    )
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", f"/v2/models/{MODEL}/infer", body, {"content-type": "application/json"})
    assert conn.getresponse().status == 200
    conn.close()


MODEL = "mlp"


def measure(repo: Path, args: list[str], work: Path) -> tuple[float, int, str]:
    log = work / "server.log"
    proc, port = engine_hop.start(repo, args, log, MODEL)
    try:
        infer_once(port)
        time.sleep(1)
        pids = descendants(proc.pid)
        each = [pss_kib(p) / 1024 for p in pids]
        return sum(each), len(pids), " + ".join(f"{e:.0f}" for e in each)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(120)


def big_repo(work: Path) -> Path:
    repo = work / "big"
    model = repo / "mlp" / "1" / "model.onnx"
    model.parent.mkdir(parents=True)
    build_models._save(build_models.mlp([64, 10240, 10240, 16], seed=0), model)
    shutil.copyfile(ROOT / "examples/models/mlp/config.pbtxt", repo / "mlp" / "config.pbtxt")
    return repo


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="engine-memory-"))
    repos = {}
    if "--big-only" not in sys.argv:
        repos["example MLP"] = work / "mlp"
        shutil.copytree(ROOT / "examples/models/mlp", work / "mlp" / "mlp")
        repos["examples/models"] = ROOT / "examples/models"
    if "--mlp-only" not in sys.argv:
        repos["big MLP (420 MB)"] = big_repo(work)
        size = (repos["big MLP (420 MB)"] / "mlp/1/model.onnx").stat().st_size
        print(f"big model: {size / 1e6:.0f} MB")
    designs = {"one process": []}
    for n in (2, 4):
        designs[f"--workers {n} --engine"] = ["--workers", str(n), "--engine"]
    if "--old" in sys.argv:
        for n in (2, 4):
            designs[f"--workers {n} (today)"] = ["--workers", str(n)]
    try:
        for what, repo in repos.items():
            base = 0.0
            for name, args in designs.items():
                pss, processes, each = measure(repo, args, work)
                base = base or pss
                print(
                    f"{what:18s} {name:22s} PSS {pss:7.0f} MiB over {processes} processes "
                    f"({pss / base:.2f}x one process; {each})"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
