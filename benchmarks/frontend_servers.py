"""Which HTTP server costs less CPU per request: uvicorn (inferd's front end today) or granian.

Three servers over the same core, serving the peers' `tiny` ONNX model (pure server
overhead; benchmarks/peers/inferd_repo.py builds it):

- `uvicorn`: `inferd serve`, i.e. uvicorn with protocol/http/fast_path.py answering the infer
  route straight from the parser;
- `granian-rsgi`: granian's RSGI interface running the infer route over the same
  `InferEndpoint.respond` (frontend_apps.py);
- `granian-asgi`: granian's ASGI interface running the existing Starlette app.

All three are up at once, each on its own ports (idle ones cost nothing measurable); wrk, one
connection and then 64, alternates between them, a few rounds. Per run: requests per
second, and the CPU seconds the server's processes used (user + system from /proc, granian's
supervisor and worker summed) divided by the requests served.

    .venv/bin/pip install -e '.[frontend-bench]'    # granian, for this benchmark only
    .venv/bin/python benchmarks/frontend_servers.py [SECONDS per run] [ROUNDS] [--threads]

Needs wrk on the PATH. Prints one line per run, then the medians per server and
connection count.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable
LUA = HERE / "peers" / "v2_infer.lua"
SERVERS = ("uvicorn", "granian-rsgi", "granian-asgi")
CONNECTIONS = (1, 64)
HZ = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def build_repository(into: Path) -> Path:
    """A repository holding only the peers' tiny model, with their config."""
    import onnx

    spec = importlib.util.spec_from_file_location("inferd_repo", HERE / "peers" / "inferd_repo.py")
    assert spec is not None and spec.loader is not None
    peers_repo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers_repo)
    config_text, tiny_model = peers_repo.CONFIG, peers_repo.tiny_model

    repo = into / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    onnx.save(tiny_model(), str(repo / "tiny" / "1" / "model.onnx"))
    outputs = '{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 16 ] }'
    config = config_text.format(name="tiny", inp="INPUT", outputs=outputs)
    (repo / "tiny" / "config.pbtxt").write_text(config)
    return repo


def start(kind: str, repo: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    grpc_port = free_port()
    env = dict(os.environ, FRONTEND_BENCH_REPO=str(repo), FRONTEND_BENCH_GRPC_PORT=str(grpc_port))
    env["FRONTEND_BENCH_HTTP_PORT"] = str(port)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    if kind == "uvicorn":
        command = [str(Path(PYTHON).parent / "inferd"), "serve", "--model-repository", str(repo)]
        command += ["--http-port", str(port), "--grpc-port", str(grpc_port)]
        command += ["--metrics-port", str(free_port()), "--log-level", "WARNING"]
    else:
        interface = kind.removeprefix("granian-")
        command = [PYTHON, "-c", GRANIAN.format(interface=interface, port=port)]
    # The servers' logs (wrk's hang-ups at the end of each run are logged) go to a file.
    with log.open("ab") as sink:
        return subprocess.Popen(
            command, env=env, start_new_session=True, stdout=sink, stderr=subprocess.STDOUT
        )


# granian's own loop choice is uvloop when installed, as uvicorn's; one worker process, as
# `inferd serve --workers 1` is one process.
GRANIAN = """
from granian import Granian
Granian(
    "frontend_apps:{interface}", address="127.0.0.1", port={port}, interface="{interface}",
    workers=1, factory={interface!r} == "asgi", log_access=False, log_level="warning",
).serve()
"""


def wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    url = f"http://127.0.0.1:{port}/v2/models/tiny/infer"
    body = (
        b'{"inputs":[{"name":"INPUT","shape":[1,64],"datatype":"FP32","data":['
        + b",".join([b"1"] * 64)
        + b"]}]}"
    )
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited ({process.returncode})")
        try:
            request = urllib.request.Request(url, body, {"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server on port {port} never answered")
        time.sleep(0.2)


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (granian's worker is a child of its supervisor)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += parents.get(p, [])
    return found


def thread_seconds(pids: list[int]) -> dict[tuple[int, str], float]:
    """CPU seconds of each thread of `pids`, by (process, thread id)."""
    found = {}
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                fields = Path(f"/proc/{p}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[(p, tid)] = (int(fields[11]) + int(fields[12])) / HZ
    return found


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return ticks / HZ


def run_wrk(port: int, connections: int, seconds: float) -> tuple[float, int, int]:
    """(req/s, requests, non-2xx) of one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(LUA)]
        + [f"http://127.0.0.1:{port}/v2/models/tiny/infer"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, total, int(bad.group(1)) if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seconds", nargs="?", type=float, default=5, help="per run")
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also print each run's CPU per request by thread (the busiest first): where "
        "granian's Rust threads take work off the Python event loop's thread",
    )
    args = parser.parse_args()
    seconds, rounds = args.seconds, args.rounds
    if shutil.which("wrk") is None:
        sys.exit("needs wrk on the PATH (apt-get install wrk)")
    try:
        import granian
    except ImportError:
        sys.exit("needs granian: .venv/bin/pip install -e '.[frontend-bench]'")
    print(f"granian {granian.__version__}, {os.cpu_count()} CPUs, {seconds:g} s per run")
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_repository(Path(tmp))
        ports = {kind: free_port() for kind in SERVERS}
        log = Path(tmp) / "servers.log"
        processes = {kind: start(kind, repo, ports[kind], log) for kind in SERVERS}
        try:
            for kind in SERVERS:
                try:
                    wait_ready(ports[kind], processes[kind])
                except RuntimeError:
                    print(log.read_text()[-4000:], file=sys.stderr)
                    raise
            pids = {kind: tree(processes[kind].pid) for kind in SERVERS}
            for kind in SERVERS:  # warm-up: first connections, first batches
                run_wrk(ports[kind], 64, 1)
            for round_ in range(rounds):
                for connections in CONNECTIONS:
                    order = SERVERS if round_ % 2 == 0 else tuple(reversed(SERVERS))
                    for kind in order:
                        before = cpu_seconds(pids[kind])
                        by_thread = thread_seconds(pids[kind]) if args.threads else {}
                        rps, total, bad = run_wrk(ports[kind], connections, seconds)
                        used = cpu_seconds(pids[kind]) - before
                        us = used / total * 1e6
                        threads = ""
                        if args.threads:
                            after = thread_seconds(pids[kind])
                            spent = [t - by_thread.get(key, 0.0) for key, t in after.items()]
                            busiest = sorted((t for t in spent if t > 0), reverse=True)
                            threads = "  threads: " + " + ".join(
                                f"{t / total * 1e6:.1f}" for t in busiest
                            )
                        results.setdefault((kind, connections), []).append((rps, us))
                        print(
                            f"round {round_ + 1} c={connections:<3} {kind:<13} {rps:>9,.0f} req/s"
                            f"  {us:6.1f} us CPU/request  ({used / seconds:.2f} cores"
                            f"{f', {bad} non-2xx' if bad else ''}){threads}",
                            flush=True,
                        )
        finally:
            for process in processes.values():
                os.killpg(process.pid, signal.SIGTERM)
            for process in processes.values():
                process.wait(timeout=60)
    print("\nmedians (CPU per request: median, and the range over the rounds):")
    print("| server | conns | req/s | CPU µs/request | range | vs uvicorn |")
    print("|---|---:|---:|---:|---|---:|")
    for connections in CONNECTIONS:
        base = statistics.median(us for _, us in results[("uvicorn", connections)])
        for kind in SERVERS:
            rows = results[(kind, connections)]
            rps = statistics.median(r for r, _ in rows)
            cpu = [u for _, u in rows]
            us = statistics.median(cpu)
            print(
                f"| {kind} | {connections} | {rps:,.0f} | {us:.1f} | {min(cpu):.0f}-{max(cpu):.0f}"
                f" | {us / base:.2f}× |"
            )
    # Round by round, the two servers ran back to back: their ratio is the steadier figure.
    for kind in SERVERS[1:]:
        for connections in CONNECTIONS:
            mine, base_rows = results[(kind, connections)], results[("uvicorn", connections)]
            ratios = sorted(k[1] / u[1] for k, u in zip(mine, base_rows, strict=True))
            print(
                f"{kind} / uvicorn CPU per request, c={connections}, per round: "
                + " ".join(f"{r:.2f}" for r in ratios)
                + f" (median {statistics.median(ratios):.2f})"
            )


if __name__ == "__main__":
    main()
