"""Overload figures for docs/reliability.md: 10x the sustainable concurrency, measured.

    .venv/bin/python benchmarks/overload.py [--clients 40] [--seconds 10] [--deadline-ms 250]

Starts `inferd serve` on a model that runs batches of up to 4 in ~20 ms (sustains ~4
concurrent requests), with a queue limit of 16, and drives it with N concurrent clients,
each sending the next request as soon as the last was answered (with --retry-after, a
client honours Retry-After on 429 instead).
Prints every status, latency percentiles per status on the client's clock, and the server's
RSS before and after.

The server gets a free port at run time (or --port, which must be free); the run stops with
an error, and prints no figures, if that server exits or another process answers on its
port (tests/support/server_process.py). Needs what `make serve` installs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.fault_models import RECORDING_PY, param, write_model  # noqa: E402
from tests.support.server_process import (  # noqa: E402
    ServerCheckError,
    check_port_free,
    check_still_serving,
    free_port,
    status_of,
    wait_until_serving,
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ServerCheckError(f"pid {pid} has no resident memory: it is not running")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(
    url: str, clients: int, seconds: float, deadline_ms: int, honour: bool
) -> dict[int, list[float]]:
    # aiohttp: httpx's connection pool itself adds up to a second at 40 busy connections,
    # which would be measured as server latency.
    by_status: dict[int, list[float]] = defaultdict(list)
    body = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    )
    headers = {"inferd-timeout-ms": str(deadline_ms), "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop_at = time.monotonic() + seconds

        async def one_client() -> None:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                async with session.post(
                    f"{url}/v2/models/busy/infer", data=body, headers=headers
                ) as r:
                    await r.read()
                    by_status[r.status].append(time.perf_counter() - started)
                    retry_after = float(r.headers.get("Retry-After", "0"))
                if r.status == 429 and honour:
                    await asyncio.sleep(retry_after)

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return by_status


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--deadline-ms", type=int, default=250)
    ap.add_argument("--retry-after", action="store_true", help="clients honour Retry-After")
    ap.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    args = ap.parse_args()
    try:
        by_status, before, after, live = measure(args)
    except ServerCheckError as e:
        print(f"overload.py: {e}", file=sys.stderr)
        return 1
    report(args, by_status, before, after, live)
    return 0


def measure(args: argparse.Namespace) -> tuple[dict[int, list[float]], float, float, bool]:
    with tempfile.TemporaryDirectory() as tmp:
        write_model(
            Path(tmp),
            "busy",
            RECORDING_PY,
            param("delay_ms", 20)
            + "dynamic_batching { default_queue_policy { max_queue_size: 16 } }",
            max_batch_size=4,
        )
        port = free_port() if args.port is None else args.port
        check_port_free(port)
        log_path = Path(tmp) / "server.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "inferd", "serve", "--model-repository", tmp,
                 "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
                 "--log-level", "ERROR"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(
                proc.pid,
                port,
                "/v2/models/busy/ready",
                exit_code=proc.poll,
                output=lambda: log_path.read_text(errors="replace"),
            )
            before = rss_mib(proc.pid)
            by_status = asyncio.run(
                drive(url, args.clients, args.seconds, args.deadline_ms, args.retry_after)
            )
            # Still ours and alive after the load: the figures are of this server.
            check_still_serving(proc.pid, port, proc.poll)
            after = rss_mib(proc.pid)
            live = status_of(f"{url}/v2/health/live") == 200
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=30)
    return by_status, before, after, live


def report(
    args: argparse.Namespace,
    by_status: dict[int, list[float]],
    before: float,
    after: float,
    live: bool,
) -> None:
    total = sum(len(v) for v in by_status.values())
    print(f"{args.clients} clients, {args.seconds:g} s, deadline {args.deadline_ms} ms, "
          f"Retry-After {'honoured' if args.retry_after else 'ignored'}: {total} answers "
          f"({total / args.seconds:,.0f}/s)")  # fmt: skip
    for status, latencies in sorted(by_status.items()):
        ms = [x * 1000 for x in latencies]
        share = 100 * len(ms) / total
        print(
            f"  HTTP {status}: {len(ms):>6} ({share:5.1f}%)  p50 {pct(ms, 0.5):7.2f} ms"
            f"  p99 {pct(ms, 0.99):7.2f} ms  max {max(ms):7.2f} ms"
            f"  mean {statistics.mean(ms):7.2f} ms"
        )
    print(f"  server RSS {before:.0f} MiB before, {after:.0f} MiB after; live afterwards: {live}")


if __name__ == "__main__":
    sys.exit(main())
