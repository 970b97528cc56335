"""Two commits of inferd side by side: the same model served by each tree in turn (never both
at once), loaded by this tree's `inferd bench` over HTTP JSON, HTTP binary and gRPC, rounds
alternating, and each wire's throughput ratio printed (B / A). A worktree of each commit is
made (and removed after); servers run `python -m inferd serve` from that tree's `src/` with
this venv's packages.

    .venv/bin/python benchmarks/ab_commits.py 5c58fb5 HEAD [--rounds 3] [--concurrency 16]
        [--duration-s 5] [--model tiny|mlp] [--workers 1]

`tiny` copies its FP32 [1, 64] input (the server's own cost); `mlp` is a 64-32-16 ONNX MLP.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from onnx import TensorProto

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.models import builders  # noqa: E402
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

WIRES = {"http-json": [], "http-binary": ["--http-binary"], "grpc": ["-i", "grpc"]}
CONFIG = 'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 32\n'
CONFIG += 'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}\n'


def repository(root: Path) -> Path:
    repo = root / "models"
    identity = builders.identity(TensorProto.FLOAT, ["batch", 64])
    builders._save(identity, repo / "tiny" / "1" / "model.onnx")
    builders._save(builders.mlp([64, 32, 16], seed=0), repo / "mlp" / "1" / "model.onnx")
    for name in ("tiny", "mlp"):
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    return repo


def worktree(commit: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(where),
                    commit], check=True)  # fmt: skip
    return where


def measure(tree: Path, repo: Path, args: argparse.Namespace, wire: str) -> float:
    http, grpc = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    server = subprocess.Popen(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", "0",
         "--workers", str(args.workers), "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until_serving(server.pid, http, exit_code=server.poll, listeners=args.workers)
        out = Path(tempfile.mkdtemp()) / "bench.json"
        port = grpc if wire == "grpc" else http
        subprocess.run(
            [sys.executable, "-m", "inferd", "bench", "-m", args.model, "-u",
             f"127.0.0.1:{port}", *WIRES[wire], "--concurrency", str(args.concurrency),
             "--warmup-s", "2", "--duration-s", str(args.duration_s), "--json", str(out)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        (level,) = json.loads(out.read_text())["levels"]
        return float(level["throughput"])
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--model", choices=["tiny", "mlp"], default="tiny")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="inferd-ab-"))
    trees = {}
    try:
        repo = repository(root)
        trees = {c: worktree(c, root / f"tree-{i}") for i, c in enumerate((args.a, args.b))}
        results: dict[str, dict[str, list[float]]] = {w: {args.a: [], args.b: []} for w in WIRES}
        for r in range(args.rounds):
            for wire in WIRES:
                order = (args.a, args.b) if r % 2 == 0 else (args.b, args.a)
                for commit in order:
                    results[wire][commit].append(measure(trees[commit], repo, args, wire))
        print(f"{args.model}, concurrency {args.concurrency}, --workers {args.workers}, "
              f"{args.rounds} alternating rounds of {args.duration_s} s (req/s)")  # fmt: skip
        for wire, runs in results.items():
            a, b = runs[args.a], runs[args.b]
            ratio = statistics.median(b) / statistics.median(a)
            print(f"  {wire:12} {args.a}: {' / '.join(f'{x:,.0f}' for x in a):24} "
                  f"{args.b}: {' / '.join(f'{x:,.0f}' for x in b):24} {ratio:.2f}x")  # fmt: skip
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
