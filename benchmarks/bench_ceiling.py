"""The ceiling of `inferd bench` itself: how many requests a second it can generate when the
server costs (almost) nothing.

    .venv/bin/python benchmarks/bench_ceiling.py [--concurrency 64] [--seconds 5]

Starts a canned KServe v2 server (raw asyncio + uvloop, one process: it answers every
infer with the same bytes, and model metadata for an 'input' FP32 [-1, 8] model), then
runs `inferd bench --concurrency N` against it over HTTP with 1 and 2 worker processes and
prints the throughput of each. On a 2-core machine the canned server shares the cores with
the generator, so this is a floor of the generator's ceiling.

    .venv/bin/python benchmarks/bench_ceiling.py --serve PORT   # just the canned server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

METADATA = json.dumps(
    {
        "name": "canned",
        "versions": ["1"],
        "platform": "canned",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 1]}],
    }
).encode()
CONFIG = json.dumps({"name": "canned", "max_batch_size": 8}).encode()
INFER = json.dumps(
    {
        "model_name": "canned",
        "model_version": "1",
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}],
    }
).encode()


def _response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


RESPONSES = {
    "infer": _response(b"200 OK", INFER),
    "config": _response(b"200 OK", CONFIG),
    "metadata": _response(b"200 OK", METADATA),
    "missing": _response(b"404 Not Found", b'{"error": "not found"}'),
}


class CannedV2(asyncio.Protocol):
    """HTTP/1.1 keep-alive, Content-Length bodies only: enough for a load generator."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            path = head.split(" ", 2)[1]
            if path.endswith("/infer"):
                key = "infer"
            elif path.endswith("/config"):
                key = "config"
            elif path.startswith("/v2/models/") and path.count("/") == 3:
                key = "metadata"
            else:
                key = "missing"
            self.transport.write(RESPONSES[key])  # type: ignore[attr-defined]


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(CannedV2, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", type=int, default=None, metavar="PORT")
    ap.add_argument("--concurrency", default="64")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--processes", default="1,2")
    args = ap.parse_args()
    if args.serve is not None:
        import uvloop

        uvloop.run(serve(args.serve))
        return
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        # The canned server is the one answering on its port (not a stranger's, nor none).
        wait_until_serving(server.pid, port, "/v2/models/canned", exit_code=server.poll)
        for processes in args.processes.split(","):
            for binary in ([], ["--http-binary"]):
                cmd = [
                    sys.executable, "-m", "inferd", "bench", "-m", "canned",
                    "-u", f"127.0.0.1:{port}", "--concurrency", args.concurrency,
                    "--processes", processes, "--warmup-s", "2",
                    "--duration-s", str(args.seconds), *binary,
                ]  # fmt: skip
                print(f"== {' '.join(cmd[2:])}", flush=True)
                subprocess.run(cmd, check=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
