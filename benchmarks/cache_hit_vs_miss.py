"""What a response cache hit costs against a miss, for the example MLP over HTTP (docs/cache.md).

Two `inferd serve` processes, up at once, each serving the example MLP twice: `mlp` (no
cache) and `mlp_cached` (`response_cache { enable: true }`):

- `local`: `--cache-config local,size=256M`;
- `redis`: `--cache-config redis,host=127.0.0.1,port=6379,db=12,timeout_ms=50` (the Redis
  tier alone, so every hit is a Redis round trip).

wrk (one thread) at 1 and then 64 connections runs, alternating, in each round:

- `miss`: `mlp` on the local server, the same row every request: the plain execution path
  (what every request costs without the cache);
- `miss unique rows`: `mlp`, a different row every request (benchmarks/wrk/
  mlp_json_unique.lua): the same, with the load generator's cost of a new body per request;
- `miss+cache local`: `mlp_cached` on the local server, a different row every request: the
  execution plus the lookup and the insert (compare it with `miss unique rows`);
- `miss+cache redis`: the same on the redis server (the insert goes out in the background);
- `hit local`: `mlp_cached` on the local server, the same row every request;
- `hit redis`: the same on the redis server.

Per run: requests per second, p50 and p99 (wrk --latency). Prints every run, then the
medians over the rounds and, per connection count, each case's mean cost per request (the
inverse of its throughput) against `miss`.

    .venv/bin/python benchmarks/cache_hit_vs_miss.py [SECONDS per run] [ROUNDS]

Needs wrk on the PATH and a Redis at 127.0.0.1:6379 (database 12's cache keys are deleted
first and last).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from tests.support.models import builders  # noqa: E402  (examples/build_models.py)
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

SAME = HERE / "wrk" / "mlp_json.lua"
UNIQUE = HERE / "wrk" / "mlp_json_unique.lua"
REDIS_DB = 12
CONNECTIONS = (1, 64)
# case -> (server, model, script)
CASES = {
    "miss": ("local", "mlp", SAME),
    "miss unique rows": ("local", "mlp", UNIQUE),
    "miss+cache local": ("local", "mlp_cached", UNIQUE),
    "miss+cache redis": ("redis", "mlp_cached", UNIQUE),
    "hit local": ("local", "mlp_cached", SAME),
    "hit redis": ("redis", "mlp_cached", SAME),
}
SERVERS = {
    "local": ["local,size=256M"],
    "redis": [f"redis,host=127.0.0.1,port=6379,db={REDIS_DB},timeout_ms=50"],
}


def build_repository(into: Path) -> Path:
    repo = into / "repo"
    config = (ROOT / "examples" / "models" / "mlp" / "config.pbtxt").read_text()
    for name, extra in (("mlp", ""), ("mlp_cached", "response_cache { enable: true }\n")):
        builders._save(builders.mlp([64, 1024, 1024, 16], seed=0), repo / name / "1" / "model.onnx")
        text = config.replace('name: "mlp"', f'name: "{name}"') + extra
        (repo / name / "config.pbtxt").write_text(text)
    return repo


def forget_redis_keys() -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    for key in client.scan_iter("inferd:cache:v1:*"):
        client.delete(key)
    client.close()


def start(repo: Path, port: int, cache: list[str], log: Path) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "inferd"), "serve", "--model-repository"]
    command += [str(repo), "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0"]
    command += ["--log-level", "WARNING"]
    for value in cache:
        command += ["--cache-config", value]
    with log.open("ab") as sink:
        return subprocess.Popen(command, start_new_session=True, stdout=sink, stderr=sink)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def run_wrk(
    port: int, model: str, script: Path, connections: int, seconds: float
) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script)]
        + [f"http://127.0.0.1:{port}/v2/models/{model}/infer"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise RuntimeError(f"{bad.group(1)} failed requests:\n{out}")
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": _ms(re.search(r"\s50%\s+(\S+)", out).group(1)),  # type: ignore[union-attr]
        "p99": _ms(re.search(r"\s99%\s+(\S+)", out).group(1)),  # type: ignore[union-attr]
    }


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
    forget_redis_keys()
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_repository(Path(tmp))
        ports = {name: free_port() for name in SERVERS}
        log = Path(tmp) / "servers.log"
        processes = {n: start(repo, ports[n], SERVERS[n], log) for n in SERVERS}
        try:
            for name, process in processes.items():
                wait_until_serving(
                    process.pid, ports[name], exit_code=process.poll,
                    output=log.read_text, timeout_s=120,
                )  # fmt: skip
            for server, model, script in CASES.values():  # warm-up; fills the hit entries
                run_wrk(ports[server], model, script, 64, 1)
            for round_ in range(args.rounds):
                for connections in CONNECTIONS:
                    order = list(CASES) if round_ % 2 == 0 else list(reversed(CASES))
                    for case in order:
                        server, model, script = CASES[case]
                        r = run_wrk(ports[server], model, script, connections, args.seconds)
                        results.setdefault((case, connections), []).append(r)
                        print(
                            f"round {round_ + 1} c={connections:<3} {case:<17} "
                            f"{r['rps']:>8,.0f} req/s  p50 {r['p50']:7.2f} ms  "
                            f"p99 {r['p99']:7.2f} ms",
                            flush=True,
                        )
        finally:
            for process in processes.values():
                os.killpg(process.pid, signal.SIGTERM)
            for process in processes.values():
                process.wait(timeout=60)
            forget_redis_keys()
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
