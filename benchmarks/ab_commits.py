"""Two commits of inferd side by side: the same model served by each tree in turn (never both
at once), loaded over HTTP JSON, HTTP binary and gRPC, rounds alternating, and each wire's
throughput ratio printed (B / A), with the median p50 and p99 of each. A worktree of each
commit is made (and removed after); servers run `python -m inferd serve` from that tree's
`src/` with this venv's packages.

    .venv/bin/python benchmarks/ab_commits.py 6703a40 HEAD [--rounds 3] [--concurrency 64]
        [--duration-s 8] [--model tiny|mlp] [--workers 1] [--load native|bench]
        [--wires http-json,http-binary,grpc]

The models are the peers' (benchmarks/peers/inferd_repo.py): `tiny` (OUTPUT = INPUT[:, :16]
* 2, the server's own cost) and `mlp` (64-1024-1024-16), max batch 32, one instance, one
ONNX Runtime thread. `--load native` (the default) loads HTTP JSON with wrk
(benchmarks/peers/v2_infer.lua: one row per request) and HTTP binary and gRPC with Triton's
perf_analyzer (benchmarks/perf_analyzer.sh), both C clients that leave the server the CPU;
`--load bench` uses this tree's `inferd bench` for all three.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

WIRES = {"http-json": [], "http-binary": ["--http-binary"], "grpc": ["-i", "grpc"]}
Run = tuple[float, float, float]  # requests/s, p50 ms, p99 ms


def repository(root: Path) -> Path:
    repo = root / "models"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/peers/inferd_repo.py"), str(repo)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return repo


def worktree(commit: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(where),
                    commit], check=True)  # fmt: skip
    return where


def measure(tree: Path, repo: Path, args: argparse.Namespace, wire: str) -> Run:
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
        port = grpc if wire == "grpc" else http
        if args.load == "bench":
            return _bench(args, wire, port)
        if wire == "http-json":
            return _wrk(args, http)
        return _perf_analyzer(args, wire, port)
    finally:
        server.terminate()
        server.wait(timeout=60)


def _bench(args: argparse.Namespace, wire: str, port: int) -> Run:
    out = Path(tempfile.mkdtemp()) / "bench.json"
    subprocess.run(
        [sys.executable, "-m", "inferd", "bench", "-m", args.model, "-u", f"127.0.0.1:{port}",
         *WIRES[wire], "--concurrency", str(args.concurrency), "--warmup-s", "2",
         "--duration-s", str(args.duration_s), "--json", str(out)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    (level,) = json.loads(out.read_text())["levels"]
    latency = level.get("latency_ms", {})
    return float(level["throughput"]), latency.get("p50", 0.0), latency.get("p99", 0.0)


def _wrk(args: argparse.Namespace, port: int) -> Run:
    url = f"http://127.0.0.1:{port}/v2/models/{args.model}/infer"
    script = str(ROOT / "benchmarks/peers/v2_infer.lua")
    threads = str(min(2, args.concurrency))
    warm = ["wrk", "-t1", f"-c{args.concurrency}", "-d2s", "-s", script, url]
    subprocess.run(warm, check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{args.concurrency}", f"-d{args.duration_s:g}s", "--latency",
         "-s", script, url],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    if "Non-2xx" in out:
        raise SystemExit(f"wrk: requests failed\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return rps, _wrk_ms(out, "50%"), _wrk_ms(out, "99%")


def _wrk_ms(out: str, percentile: str) -> float:
    value = re.search(rf"^\s+{percentile}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    assert value is not None, out
    return float(value.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[value.group(2)]


def _perf_analyzer(args: argparse.Namespace, wire: str, port: int) -> Run:
    out = Path(tempfile.mkdtemp()) / "pa.csv"
    protocol = "grpc" if wire == "grpc" else "http"
    for _ in range(3):  # it exits 2 when 3 windows were not within 50% of each other: again
        done = subprocess.run(
            ["bash", str(ROOT / "benchmarks/perf_analyzer.sh"), "-m", args.model,
             "-u", f"127.0.0.1:{port}", "-i", protocol, "--concurrency-range",
             str(args.concurrency), "--measurement-interval", str(int(args.duration_s * 1000)),
             "--stability-percentage", str(getattr(args, "stability", 50)),
             "--max-trials", str(getattr(args, "max_trials", 3)), "--percentile=99",
             "-f", str(out)],
            check=False, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode == 0 and out.exists():
            break
    else:
        raise SystemExit(f"perf_analyzer failed 3 times:\n{done.stdout[-2000:]}{done.stderr}")
    with out.open() as f:
        (row,) = list(csv.DictReader(f))
    return (float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000,
            float(row["p99 latency"]) / 1000)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--model", choices=["tiny", "mlp"], default="tiny")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--load", choices=["native", "bench"], default="native")
    parser.add_argument("--wires", default=",".join(WIRES), help="comma-separated")
    args = parser.parse_args()
    wires = args.wires.split(",")
    root = Path(tempfile.mkdtemp(prefix="inferd-ab-"))
    trees = {}
    try:
        repo = repository(root)
        trees = {c: worktree(c, root / f"tree-{i}") for i, c in enumerate((args.a, args.b))}
        results: dict[str, dict[str, list[Run]]] = {w: {args.a: [], args.b: []} for w in wires}
        for r in range(args.rounds):
            for wire in wires:
                order = (args.a, args.b) if r % 2 == 0 else (args.b, args.a)
                for commit in order:
                    results[wire][commit].append(measure(trees[commit], repo, args, wire))
        print(f"{args.model}, concurrency {args.concurrency}, --workers {args.workers}, "
              f"{args.rounds} alternating rounds of {args.duration_s:g} s, load {args.load}: "
              "req/s each round; median p50 / p99 ms")  # fmt: skip
        for wire, runs in results.items():
            a, b = runs[args.a], runs[args.b]
            ratio = statistics.median(r[0] for r in b) / statistics.median(r[0] for r in a)
            print(f"  {wire:12} {args.a}: {_runs(a)}   {args.b}: {_runs(b)}   {ratio:.2f}x")
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _runs(runs: list[Run]) -> str:
    rps = " / ".join(f"{r[0]:,.0f}" for r in runs)
    p50 = statistics.median(r[1] for r in runs)
    p99 = statistics.median(r[2] for r in runs)
    return f"{rps} (p50 {p50:.2f}, p99 {p99:.2f})"


if __name__ == "__main__":
    main()
