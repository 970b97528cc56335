"""What one malloc arena costs the request path (docs/benchmarks.md, "Memory across hot swaps").

    .venv/bin/python benchmarks/malloc_arena_cost.py [--rounds 3] [--concurrency 8]
        [--duration-s 10]

inferd runs with one glibc malloc arena (inferd.repository.memory_release.configure_allocator) so
that swapped out versions give their memory back; glibc's default is 8 arenas per core. This serves
two models from two servers at once, one with inferd's setting and one with MALLOC_ARENA_MAX set to
glibc's default, and loads them in turn (A, B, A, B, ...) with `inferd bench` over HTTP (binary
tensors) and gRPC. Besides throughput and p99 it reports the server's CPU time per request (from
/proc), which other load on a shared machine disturbs far less:

- `mlp`: the example MLP (64 FP32 in, small tensors: malloc's per-thread cache serves them);
- `big`: an identity model on one 1 MiB FP32 row per request (blocks that take the arena lock).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.models import builders  # noqa: E402
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

BIG_ROW = 1 << 18  # FP32 values: 1 MiB


def build_repository(repo: Path) -> None:
    from onnx import TensorProto

    (repo / "mlp").mkdir(parents=True)
    (repo / "mlp" / "config.pbtxt").write_text(
        (ROOT / "examples" / "models" / "mlp" / "config.pbtxt").read_text()
    )
    builders._save(builders.mlp([64, 1024, 1024, 16], seed=0), repo / "mlp" / "1" / "model.onnx")
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", BIG_ROW]), repo / "big" / "1" / "model.onnx"
    )


@contextlib.contextmanager
def server(repo: Path, arenas: str) -> Iterator[tuple[int, int, int]]:
    """(pid, HTTP port, gRPC port) of `inferd serve` with `arenas` ("inferd": its own)."""
    env = dict(os.environ)
    env.pop("MALLOC_ARENA_MAX", None)
    if arenas != "inferd":
        env["MALLOC_ARENA_MAX"] = arenas
    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
            "--http-port", str(http_port), "--grpc-port", str(grpc_port),
            "--metrics-port", "0", "--log-level", "WARNING",
        ],
        env=env,
    )  # fmt: skip
    try:
        # Our own process on the port chosen now, never a stranger that took it.
        wait_until_serving(proc.pid, http_port, exit_code=proc.poll, timeout_s=60)
        yield proc.pid, http_port, grpc_port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(
    model: str, protocol: str, pid: int, port: int, concurrency: int, seconds: float
) -> tuple[float, float, float]:
    """Throughput (req/s), p99 (ms), server CPU per request (µs)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        args = [
            sys.executable, "-m", "inferd", "bench", "-m", model, "-u", f"127.0.0.1:{port}",
            "-i", protocol, "--concurrency", str(concurrency), "--warmup-s", "0",
            "--duration-s", str(seconds), "--json", out.name,
        ]  # fmt: skip
        if protocol == "http":
            args.append("--http-binary")
        # No warm-up: the CPU counted is that of the requests measured (the servers are
        # warm from the rounds before; the first round carries their first requests).
        cpu_before = cpu_seconds(pid)
        subprocess.run(args, check=True, capture_output=True)
        cpu = cpu_seconds(pid) - cpu_before
        level = json.loads(Path(out.name).read_text())["levels"][0]
        return level["throughput"], level["latency_ms"]["p99"], cpu / level["completed"] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    variants = ("inferd", str(8 * (os.cpu_count() or 1)))  # glibc's default: 8 per core
    results: dict[tuple[str, str, str], list[tuple[float, float, float]]] = defaultdict(list)
    with (
        tempfile.TemporaryDirectory(prefix="inferd-arenas-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        repo = Path(tmp) / "models"
        build_repository(repo)
        servers = {v: stack.enter_context(server(repo, v)) for v in variants}
        for round_ in range(1, args.rounds + 1):
            for model in ("mlp", "big"):
                for protocol in ("http", "grpc"):
                    for arenas in variants:
                        pid, http_port, grpc_port = servers[arenas]
                        port = http_port if protocol == "http" else grpc_port
                        figures = bench(
                            model, protocol, pid, port, args.concurrency, args.duration_s
                        )
                        results[(model, protocol, arenas)].append(figures)
                        print(
                            f"round {round_} {model} {protocol} arenas={arenas}: "
                            f"{figures[0]:,.0f} req/s, p99 {figures[1]:.2f} ms, "
                            f"{figures[2]:,.0f} µs CPU/request",
                            flush=True,
                        )
    print()
    print(
        f"| model | protocol | 1 arena (inferd): req/s, p99, CPU/request "
        f"| {variants[1]} arenas: req/s, p99, CPU/request |"
    )
    print("|---|---|---|---|")
    for model in ("mlp", "big"):
        for protocol in ("http", "grpc"):
            cells = []
            for arenas in variants:
                runs = results[(model, protocol, arenas)]
                cells.append(
                    f"{statistics.median(r[0] for r in runs):,.0f}, "
                    f"{statistics.median(r[1] for r in runs):.2f} ms, "
                    f"{statistics.median(r[2] for r in runs):,.0f} µs"
                )
            print(f"| {model} | {protocol} | {cells[0]} | {cells[1]} |")
    print(f"(medians of {args.rounds} rounds, concurrency {args.concurrency})")


if __name__ == "__main__":
    main()
