"""A soak, all faults at once (docs/reliability.md, "The soak"): `inferd serve --workers 2`
with a shared Redis cache, under steady mixed traffic on every example model over HTTP and
gRPC, a hot swap every minute, a canary promoted and rolled back, bursts of 10x what mlp
executes at once, invalid and hostile requests and slow clients, Redis killed and restarted, and a
worker killed; readiness, memory, descriptors and threads of every process watched.

    .venv/bin/python benchmarks/soak.py                      # 30 minutes
    .venv/bin/python benchmarks/soak.py --duration-s 180     # what `make test` runs
    .venv/bin/python benchmarks/soak.py --json soak.json     # the whole result as JSON

Prints a summary (requests by model and way, faults injected, findings by kind, slopes per
process) and exits 1 when a pass criterion failed, 2 when it could not run. Its folder (the
model repository, the server's log) is removed after a run that passed and kept, and
named, after one that failed (or kept where --work-dir says). Needs the example models'
builders (what `make serve` installs) and `redis-server` on PATH. Starts everything it uses
on free ports of 127.0.0.1 and ends every process it started.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.server_process import ServerCheckError  # noqa: E402
from tests.support.soak_plan import default_warmup_s  # noqa: E402
from tests.support.soak_report import Bounds  # noqa: E402
from tests.support.soak_run import Options, run, summary  # noqa: E402


def options(argv: list[str] | None = None) -> tuple[Options, Path | None]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=1800.0, help="default 30 minutes")
    ap.add_argument("--warmup-s", type=float, default=None,
                    help="memory is judged after it (default: 300 s, or a quarter of a run "
                    "shorter than 20 minutes)")  # fmt: skip
    ap.add_argument("--rate", type=float, default=30.0, help="steady valid requests a second")
    ap.add_argument("--clients", type=int, default=6, help="steady client threads")
    ap.add_argument("--burst-factor", type=int, default=10,
                    help="a burst's connections per request mlp executes at once (its batch of "
                    "32 in each of the 2 workers): 10 sends 640 at once")  # fmt: skip
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument(
        "--grace-s",
        type=float,
        default=25.0,
        help="how long the versions before a swap or canary step may still answer",
    )
    ap.add_argument("--max-rss-slope-mib-h", type=float, default=32.0)
    ap.add_argument("--max-fd-slope-h", type=float, default=64.0)
    ap.add_argument("--max-thread-slope-h", type=float, default=8.0)
    ap.add_argument("--max-series-slope-h", type=float, default=200.0,
                    help="samples /metrics exports, per hour after warm-up")  # fmt: skip
    ap.add_argument(
        "--cache-timeout-ms",
        type=int,
        default=None,
        help="the Redis tier's timeout_ms (default: the server's own default)",
    )
    ap.add_argument("--work-dir", type=Path, default=None, help="kept after the run")
    ap.add_argument("--json", type=Path, default=None, help="write the whole result here")
    args = ap.parse_args(argv)
    warmup = default_warmup_s(args.duration_s) if args.warmup_s is None else args.warmup_s
    return Options(
        duration_s=args.duration_s,
        warmup_s=warmup,
        rate=args.rate,
        clients=args.clients,
        burst_factor=args.burst_factor,
        seed=args.seed,
        grace_s=args.grace_s,
        bounds=Bounds(
            args.max_rss_slope_mib_h,
            args.max_fd_slope_h,
            args.max_thread_slope_h,
            args.max_series_slope_h,
        ),
        cache_timeout_ms=args.cache_timeout_ms,
        work_dir=args.work_dir,
    ), args.json


def main(argv: list[str] | None = None) -> int:
    opts, json_path = options(argv)
    if shutil.which("redis-server") is None:
        print("soak.py: redis-server is not on PATH", file=sys.stderr)
        return 2
    try:
        result = run(opts)
    except ServerCheckError as exc:
        print(f"soak.py: the server did not start: {exc}", file=sys.stderr)
        return 2
    print(summary(result))
    if not result["passed"]:
        print(f"\nits folder, with the server's log, is kept: {result['work_dir']}")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
