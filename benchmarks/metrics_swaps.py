"""/metrics across hot swaps: its size, the versions it names, and the supervisor's memory
(docs/benchmarks.md, "Memory across hot swaps").

    .venv/bin/python benchmarks/metrics_swaps.py [--swaps 20] [--workers 2]
        [--before-src DIR]

Serves tests/support/swap_memory.py's two models (a 64 MiB ONNX model, a 64 MiB Python model)
in poll mode under one HTTP and one gRPC client per worker, swaps both to a new version
`--swaps` times and, once every worker logged each unload, scrapes /metrics once: the text's
size, how many versions of the two models it names, and (with --workers) the supervisor's RSS,
which merges every worker's families at each scrape. `--before-src DIR` runs the same first
with the server imported from DIR (e.g. `git archive <commit> src | tar -x -C DIR`, then
DIR/src), for a before/after table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.swap_memory import (  # noqa: E402
    DEADLINE_S,
    MODELS,
    Load,
    SwapServer,
    rss_bytes,
    serve,
    write_repository,
    write_version,
)

MIB = 1 << 20


def _wait_unloads(server: SwapServer, count: int) -> None:
    """Until `count` version unloads are logged (each worker logs its own)."""
    deadline = time.monotonic() + DEADLINE_S
    while server.output().count('"unloaded model ') < count:
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{count} unloads not logged:\n{server.output()[-4000:]}")
        time.sleep(0.05)


def _scrape(server: SwapServer) -> tuple[int, int]:
    """The scrape's size in bytes, and how many versions of the models it names."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 (loopback)
        text = r.read().decode()
    versions = {
        (s.labels["model"], s.labels["version"])
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model") in MODELS and "version" in s.labels
    }
    return len(text), len(versions)


def run(swaps: int, workers: int, source: str) -> list[tuple[int, int, int]]:
    """(bytes, versions named, supervisor RSS) before the first swap, then after each."""
    env = os.environ.get("PYTHONPATH")
    if source:
        os.environ["PYTHONPATH"] = source
    try:
        with tempfile.TemporaryDirectory(prefix="inferd-metrics-swaps-") as tmp:
            root = Path(tmp)
            repo = root / "repo"
            write_repository(repo)
            args = ("--workers", str(workers)) if workers > 1 else ()
            with (
                serve(repo, root / "server.log", *args) as server,
                Load(server.http_port, server.grpc_port, clients_per_protocol=workers) as load,
            ):
                load.wait_answers(40)
                rows = [(*_scrape(server), rss_bytes(server.proc.pid))]
                for version in range(2, 2 + swaps):
                    write_version(repo, version)
                    _wait_unloads(server, len(MODELS) * workers * (version - 1))
                    load.wait_answers(load.total() + 10)  # the new version under traffic
                    rows.append((*_scrape(server), rss_bytes(server.proc.pid)))
                    size, named, rss = rows[-1]
                    print(
                        f"{'before' if source else 'after':>6} swap {version - 1:2d}: "
                        f"{size / 1000:6.0f} KB, {named} versions, {rss / MIB:5.1f} MiB",
                        flush=True,
                    )
                assert not load.failures, load.failures[:5]
            return rows
    finally:
        if env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before-src", default="", help="a source tree's src/ to compare")
    args = parser.parse_args()
    runs = {}
    if args.before_src:
        runs["before"] = run(args.swaps, args.workers, str(Path(args.before_src).resolve()))
    runs["after"] = run(args.swaps, args.workers, "")
    rss = "supervisor RSS (MiB)" if args.workers > 1 else "server RSS (MiB)"
    print()
    print("| swap | " + " | ".join(f"{v}: /metrics (KB), versions, {rss}" for v in runs) + " |")
    print("|---:|" + "---|" * len(runs))
    for i in range(args.swaps + 1):
        cells = [
            f"{rows[i][0] / 1000:.0f}, {rows[i][1]}, {rows[i][2] / MIB:.1f}"
            for rows in runs.values()
        ]
        print(f"| {i or 'baseline'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
