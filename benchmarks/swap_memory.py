"""Resident memory over hot swaps, before and after inferd gives memory back (docs/benchmarks.md).

    .venv/bin/python benchmarks/swap_memory.py [--swaps 20] [--variants before,trim,after]
        [--workers 2] [--isolation process] [--runs 1] [--leak-mib 0]

Serves tests/support/swap_memory.py's two models (a 64 MiB ONNX model, a 64 MiB Python model) in
poll mode under one HTTP and one gRPC client per worker, swaps both to a new version
`--swaps` times, and reads the server's memory after each swap has been released
(`process_resident_memory_bytes`, summed over --workers, plus the model worker processes'
RSS). Variants, all from this tree:

- `before`: as inferd was before the fix: no malloc_trim, glibc's default malloc arenas,
  no collection of frozen objects (inferd.repository.memory_release's functions patched out at
  start);
- `trim`: malloc_trim and the full collection after every release, default arenas;
- `after`: what inferd does: the trim, the collection, and one malloc arena.

`--leak-mib N` makes the Python model leak N MiB at each load (kept in a module that
outlives the version), to see what the swap test's bound (`GROWTH_BOUND`) catches.

Prints one line per swap and variant, then a markdown table of MiB per swap, and for each run
the growth, whether it is within the swap test's bound, and how many of the server's
repository passes were not swaps (a pass that read a model again between two swaps: its
memory would be in the figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.swap_memory import (  # noqa: E402
    GROWTH_BOUND,
    MODELS,
    Load,
    serve,
    write_repository,
    write_version,
)

MIB = 1 << 20

# The server's command line for each variant: `python -c PATCH serve ...`.
_PATCHES = {
    "before": "m.malloc_trim = lambda: False; m.configure_allocator = lambda: None; "
    "m.collect_everything = gc.collect",
    "trim": "m.configure_allocator = lambda: None",
    "after": "",
}


def _python(variant: str) -> tuple[str, ...]:
    code = (
        "import gc, sys; import inferd.repository.memory_release as m; "
        + (_PATCHES[variant] + "; " if _PATCHES[variant] else "")
        + "from inferd.cli.main import main; sys.exit(main())"
    )
    return (sys.executable, "-c", code)


def run(
    variant: str, swaps: int, workers: int, isolation: str, leak_mib: int
) -> tuple[list[int], float, int, int]:
    """Memory before the first swap, then after each; seconds; failed requests; repository
    passes that were not swaps."""
    with tempfile.TemporaryDirectory(prefix="inferd-swap-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        write_repository(repo, isolation, leak_mib)
        args = ("--workers", str(workers)) if workers > 1 else ()
        with (
            serve(repo, root / "server.log", *args, python=_python(variant)) as server,
            Load(server.http_port, server.grpc_port, clients_per_protocol=workers) as load,
        ):
            load.wait_answers(40)
            values = [server.memory(workers)]
            started = time.monotonic()
            for version in range(2, 2 + swaps):
                write_version(repo, version)
                server.wait_unloads(len(MODELS) * workers * (version - 1))
                values.append(server.memory(workers))
                print(
                    f"{variant:>6} swap {version - 1:2d}: {values[-1] / MIB:6.0f} MiB "
                    f"({values[-1] / values[0] - 1:+.1%})",
                    flush=True,
                )
            seconds = time.monotonic() - started
            extra = [r for r in server.log_events("memory_released") if r["reason"] != "unloaded"]
        return values, seconds, len(load.failures), len(extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--variants", default="before,trim,after")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--isolation", choices=("thread", "process"), default="thread")
    parser.add_argument("--runs", type=int, default=1, help="runs per variant (spread)")
    parser.add_argument("--leak-mib", type=int, default=0, help="leak per Python model load")
    args = parser.parse_args()
    variants = args.variants.split(",")
    results: dict[str, list[list[int]]] = {v: [] for v in variants}
    for _ in range(args.runs):
        for variant in variants:
            values, seconds, failures, extra = run(
                variant, args.swaps, args.workers, args.isolation, args.leak_mib
            )
            results[variant].append(values)
            print(
                f"{variant}: {args.swaps} swaps in {seconds:.0f} s, {failures} failed requests, "
                f"{extra} repository passes that were not swaps"
            )
    print()
    print("| swap | " + " | ".join(f"{v} (MiB)" for v in variants) + " |")
    print("|---:|" + "---:|" * len(variants))
    for i in range(args.swaps + 1):
        cells = [f"{statistics.mean(r[i] for r in results[v]) / MIB:.0f}" for v in variants]
        print(f"| {i or 'baseline'} | " + " | ".join(cells) + " |")
    print()
    for v in variants:
        finals = [r[-1] / r[0] - 1 for r in results[v]]
        peaks = [max(r[1:]) / r[0] - 1 for r in results[v]]
        within = ["yes" if r[-1] <= r[0] * GROWTH_BOUND else "NO" for r in results[v]]
        print(
            f"{v}: after the last swap {', '.join(f'{f:+.1%}' for f in finals)} of the "
            f"baseline; highest after any swap {', '.join(f'{p:+.1%}' for p in peaks)}; "
            f"within the swap test's bound (+{GROWTH_BOUND - 1:.0%}): {', '.join(within)}"
        )


if __name__ == "__main__":
    main()
