"""What the hop of `--workers N --engine` costs a request (docs/benchmarks.md, "The engine's hop").

    .venv/bin/python benchmarks/engine_hop.py [REQUESTS] [ROUNDS]     (default: 3000 3)

1. The hop alone, in one process: µs of CPU per request on each side for one 64-float row in
   and a 16-float row out (the peers' `tiny`): the front end packing the request and reading
   the answer, the engine reading the request and packing the answer (slab writes, the
   descriptors' marshal, framing). Socket writes are not in it (one per loop turn, shared
   by every descriptor ready then).
2. End to end: one connection, REQUESTS sequential requests to `tiny`, against `inferd
   serve` (one process) and `inferd serve --workers 2 --engine`, alternating ROUNDS times:
   p50 of each and the difference (what the hop adds to a lone request), and µs of CPU per
   request of each process (from /proc/PID/stat), front ends and engine apart.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inferd.engine import hop
from inferd.engine.slab import Slab, SlabAllocator
from inferd.events import CallContext
from inferd.types import InferRequest, InferResponse, Tensor

ROOT = Path(__file__).resolve().parent.parent
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def hop_alone(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        requests = Slab(Path(d) / "req", 1 << 20, create=True)
        responses = Slab(Path(d) / "resp", 1 << 20, create=True)
        front_alloc, engine_alloc = SlabAllocator(1 << 20), SlabAllocator(1 << 20)
        row = np.random.default_rng(0).random((1, 64), dtype=np.float32)
        out = row[:, :16] * 2
        ctx = CallContext("http", "127.0.0.1:1", "", time.time(), time.perf_counter_ns())
        front_send = engine_recv = engine_send = front_recv = 0
        for _ in range(n):
            request = InferRequest("tiny", "", [Tensor("INPUT", "FP32", (1, 64), row)], "")
            t0 = time.process_time_ns()
            regions: list[int] = []
            inputs = hop.pack_tensors(request.inputs, requests, front_alloc, regions)
            wire = _frame(hop.request_message(1, request, ctx, inputs))
            t1 = time.process_time_ns()
            (message,) = hop.FrameReader().feed(wire)
            _, got, _ = hop.request_from(message, requests)
            t2 = time.process_time_ns()
            response = InferResponse("tiny", "1", [Tensor("OUTPUT", "FP32", (1, 16), out)])
            out_regions: list[int] = []
            outputs = hop.pack_tensors(response.outputs, responses, engine_alloc, out_regions)
            answer = _frame(hop.answer_message(1, response, outputs, out_regions))
            t3 = time.process_time_ns()
            (reply,) = hop.FrameReader().feed(answer)
            hop.response_from(reply, responses)
            for offset in regions:
                front_alloc.free(offset)
            release = _frame((hop.RELEASE, out_regions))
            t4 = time.process_time_ns()
            hop.FrameReader().feed(release)
            for offset in out_regions:
                engine_alloc.free(offset)
            t5 = time.process_time_ns()
            front_send += t1 - t0
            engine_recv += t2 - t1
            engine_send += t3 - t2 + t5 - t4
            front_recv += t4 - t3
        requests.unlink()
        responses.unlink()
    return {
        "front end, request out": front_send / n / 1e3,
        "engine, request in": engine_recv / n / 1e3,
        "engine, answer out (+ release)": engine_send / n / 1e3,
        "front end, answer in": front_recv / n / 1e3,
    }


def _frame(message: tuple[object, ...]) -> bytes:
    import marshal

    payload = marshal.dumps(message)
    return len(payload).to_bytes(4, "little") + payload


# -- end to end --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    repo: Path, args: list[str], log: Path, model: str = "tiny"
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/inferd"), "serve", "--model-repository", str(repo),
            "--http-port", str(port), "--grpc-port", str(_free_port()),
            "--metrics-port", "0", "--log-level", "INFO", *args,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if _get(port, f"/v2/models/{model}/ready").startswith(b"HTTP/1.1 200"):
                time.sleep(1)  # every front end listening
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start: {log.read_text()}")


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        return s.recv(65536)


def _pids(proc: subprocess.Popen[bytes], log: Path) -> dict[str, list[int]]:
    """The server's processes: the one server, or front ends and the engine."""
    found = re.findall(r"worker (\d+) started \(pid (\d+)\)", log.read_text())
    if not found:
        return {"server": [proc.pid]}
    latest = {int(i): int(p) for i, p in found}
    engine = max(latest)
    return {"front ends": [p for i, p in latest.items() if i != engine], "engine": [latest[engine]]}


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def lone_requests(port: int, n: int) -> list[float]:
    body = (
        b'{"inputs":[{"name":"INPUT","datatype":"FP32","shape":[1,64],"data":['
        + b",".join(b"0.5" for _ in range(64))
        + b"]}]}"
    )
    head = (
        f"POST /v2/models/tiny/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    latencies = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(request)
            data = s.recv(65536)
            header_end = data.index(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", data[:header_end], re.I).group(1))  # type: ignore[union-attr]
            while len(data) < header_end + 4 + length:
                data += s.recv(65536)
            latencies.append((time.perf_counter() - t0) * 1e6)
            assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return latencies


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print("1. the hop alone, µs of CPU per request (median of 5 runs of", n, "requests)")
    runs = [hop_alone(n) for _ in range(5)]
    for key in runs[0]:
        print(f"   {key:32s} {statistics.median(r[key] for r in runs):6.1f}")
    total = statistics.median(sum(r.values()) for r in runs)
    print(f"   {'both sides':32s} {total:6.1f}")

    work = Path(tempfile.mkdtemp(prefix="engine-hop-"))
    repo = work / "repo"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/peers/inferd_repo.py"), str(repo)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"2. end to end, one connection, {n} requests to tiny per run")
    designs = {"one process": [], "--workers 2 --engine": ["--workers", "2", "--engine"]}
    p50s: dict[str, list[float]] = {d: [] for d in designs}
    for r in range(rounds):
        for name, args in designs.items():
            log = work / f"{r}-{len(args)}.log"
            proc, port = start(repo, args, log)
            try:
                lone_requests(port, 300)  # warm
                pids = _pids(proc, log)
                before = {k: sum(_cpu_ticks(p) for p in v) for k, v in pids.items()}
                latencies = lone_requests(port, n)
                after = {k: sum(_cpu_ticks(p) for p in v) for k, v in pids.items()}
            finally:
                os.killpg(proc.pid, 2)
                proc.wait(60)
            p50 = statistics.median(latencies)
            p50s[name].append(p50)
            cpu = ", ".join(
                f"{k} {(after[k] - before[k]) * TICK_US / n:.0f} µs CPU/request" for k in pids
            )
            print(f"   round {r + 1} {name:22s} p50 {p50:6.0f} µs  ({cpu})")
    one, two = (statistics.median(v) for v in p50s.values())
    print(
        f"   median p50: one process {one:.0f} µs, engine {two:.0f} µs: "
        f"the hop adds {two - one:.0f} µs"
    )


if __name__ == "__main__":
    main()
