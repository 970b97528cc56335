"""Figures for docs/reliability.md: what one hostile client costs everyone else.

    .venv/bin/python benchmarks/hostile_clients.py            # as inferd serves by default
    .venv/bin/python benchmarks/hostile_clients.py --inline   # coding on the event loop

Starts `inferd serve` on two identity models (FP32, INT8) and, for each large request
below, sends it while a second client probes GET /v2/health/ready back to back on its own
connection; prints the large request's status and time, and the probes' latency while it
was in flight (p50 / max). `--inline` sets --offload-threshold-kib past any request, which
is how every request was decoded before offloading existed. Then the connection scenarios:
3,000 idle connections (how long until the server has closed them) and a flood past
--max-connections (how many were refused, whether health probes were still answered).

The server gets a free port; the run stops with an error, and prints no figures, if that
server exits or another process answers on its port (tests/support/server_process.py). Needs what
`make serve` installs (the client is the standard library's http.client).
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.models import builders  # noqa: E402
from tests.support.server_process import (  # noqa: E402
    check_port_free,
    check_still_serving,
    free_port,
    wait_until_serving,
)

MIB = 1 << 20


def binary_request(datatype: str, count: int, data: bytes) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": datatype,
                    "shape": [1, count],
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        }
    )
    return head + data, {"Inference-Header-Content-Length": str(len(head))}


def json_zeros(count: int) -> bytes:
    return (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,%d],"data":[' % count
        + b"0," * (count - 1)
        + b"0]}]}"
    )


def scenarios() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(what, model, body, headers). The BYTES and JSON requests go to a model of another
    datatype: refused right after decoding, so their time is the decoding's."""
    n = 16_000_000
    empty_bytes, bytes_headers = binary_request("BYTES", n, b"\0\0\0\0" * n)
    floats, float_headers = binary_request("FP32", 15 * MIB, bytes(60 * MIB))
    zeros = json_zeros(29 * MIB)
    repeated = orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
            ],
            "outputs": [{"name": "OUTPUT0"}] * 100_000,
        }
    )
    return [
        ("61 MiB binary, 16 M empty BYTES elements", "identity_fp32", empty_bytes, bytes_headers),
        ("58 MiB JSON of zeros", "identity_int8", zeros, {}),
        ("60 MiB binary FP32", "identity_fp32", floats, float_headers),
        ("one output requested 100,000 times", "identity_fp32", repeated, {}),
    ]


@dataclass
class Answer:
    status: int
    size: int


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return Answer(response.status, len(response.read()))
    finally:
        conn.close()


def ready(conn: http.client.HTTPConnection) -> None:
    conn.request("GET", "/v2/health/ready")
    response = conn.getresponse()
    response.read()
    assert response.status == 200, f"a health probe got {response.status}"


def probe_while(port: int, work: Callable[[], Answer]) -> tuple[Answer, float, list[float]]:
    """Run `work` on a thread; meanwhile probe readiness back to back on one connection."""
    done = threading.Event()
    result: list[Answer] = []
    took: list[float] = []

    def run() -> None:
        started = time.perf_counter()
        result.append(work())
        took.append(time.perf_counter() - started)
        done.set()

    latencies: list[float] = []
    probe = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        ready(probe)  # the connection is open before the large request
        thread = threading.Thread(target=run)
        thread.start()
        while not done.is_set():
            started = time.perf_counter()
            ready(probe)
            latencies.append(time.perf_counter() - started)
        thread.join()
    finally:
        probe.close()
    return result[0], took[0], latencies


def idle_connections(port: int, count: int) -> float:
    """Seconds until the server has closed `count` connections that never send a byte."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    started = time.perf_counter()
    for s in socks:
        s.settimeout(120)
        assert s.recv(1) == b""
        s.close()
    return time.perf_counter() - started


def flood(port: int, count: int) -> tuple[int, int, int, float]:
    """Open `count` connections that send nothing; after a second, return how many the
    server refused (429), closed and kept, and how long a health probe then took."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    for s in socks:
        s.setblocking(False)
    refused, closed = set(), set()
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if i in refused or i in closed:
                continue
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            (refused if data.startswith(b"HTTP/1.1 429") else closed).add(i)
    started = time.perf_counter()
    probe = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ready(probe)
    probe.close()
    probe_s = time.perf_counter() - started
    for s in socks:
        s.close()
    return len(refused), len(closed), count - len(refused) - len(closed), probe_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inline", action="store_true", help="decode and encode on the event loop")
    ap.add_argument("--idle", type=int, default=3000)
    ap.add_argument("--flood", type=int, default=3000)
    ap.add_argument(
        "--max-bytes-elements", type=int, default=1 << 20, help="the server's option (default its)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        from onnx import TensorProto

        models = {"identity_fp32": TensorProto.FLOAT, "identity_int8": TensorProto.INT8}
        for name, onnx_type in models.items():
            model = builders.identity(onnx_type, ["batch", "n"])
            builders._save(model, Path(tmp) / name / "1" / "model.onnx")
        port = free_port()
        check_port_free(port)
        extra = ["--offload-threshold-kib", str(1 << 30)] if args.inline else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferd", "serve", "--model-repository", tmp,
             "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
             "--log-level", "ERROR", "--max-bytes-elements", str(args.max_bytes_elements), *extra]
        )  # fmt: skip
        try:
            wait_until_serving(proc.pid, port, exit_code=proc.poll)
            print(f"decoding {'on the event loop' if args.inline else 'off the event loop'}:")
            for what, model_name, body, headers in scenarios():

                def send(
                    path: str = f"/v2/models/{model_name}/infer",
                    body: bytes = body,
                    headers: dict[str, str] = headers,
                ) -> Answer:
                    return post(port, path, body, headers)

                answer, took, probes = probe_while(port, send)
                ms = [x * 1000 for x in probes]
                print(
                    f"  {what}: HTTP {answer.status} ({answer.size / MIB:.1f} MiB) in {took:.2f} s;"
                    f" {len(ms)} probes meanwhile, p50 {statistics.median(ms):.1f} ms, max "
                    f"{max(ms):.1f} ms"
                )
            idle_s = idle_connections(port, args.idle)
            print(f"  {args.idle} idle connections: all closed by the server after {idle_s:.1f} s")
            refused, closed, kept, probe_s = flood(port, args.flood)
            print(
                f"  {args.flood} silent connections at once: {refused} refused (429), {closed} "
                f"closed for newer ones, {kept} kept; a health probe then took "
                f"{probe_s * 1000:.1f} ms"
            )
            check_still_serving(proc.pid, port, proc.poll)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
