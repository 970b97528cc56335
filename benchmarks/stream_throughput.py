"""Decoupled streams: responses per second over gRPC ModelStreamInfer and HTTP generate_stream.

    .venv/bin/python benchmarks/stream_throughput.py [--responses 2000] [--streams 1,4]

Starts `inferd serve` (its own process) on tests/support/stream_models.py's `repeat_triton` and
`repeat_inferd` (one small INT32 response after another, as fast as the model can send),
then, for each model, protocol and number of concurrent streams, asks each stream for
`--responses` responses and reports responses/s on the client's clock (first request sent
to last response read) and the server process's RSS before and after.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.server_process import (  # noqa: E402
    check_still_serving,
    free_port,
    wait_until_serving,
)
from tests.support.stream_models import write_stream_models  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def grpc_run(address: str, model: str, streams: int, responses: int) -> float:
    client = grpcclient.InferenceServerClient(address)
    done: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: done.put((result, error)))
    start = time.perf_counter()
    for tag in range(streams):
        inputs = []
        for name, value in (("N", responses), ("TAG", tag)):
            inp = grpcclient.InferInput(name, [1], "INT32")
            inp.set_data_from_numpy(np.array([value], np.int32))
            inputs.append(inp)
        client.async_stream_infer(model, inputs, request_id=str(tag))
    for _ in range(streams * responses):
        _, error = done.get(timeout=120)
        if error is not None:
            raise RuntimeError(str(error))
    elapsed = time.perf_counter() - start
    client.stop_stream()
    client.close()
    return streams * responses / elapsed


def http_run(url: str, model: str, streams: int, responses: int) -> float:
    counts = [0] * streams

    def one(tag: int) -> None:
        body = json.dumps({"N": responses, "TAG": tag}).encode()
        request = urllib.request.Request(
            f"{url}/v2/models/{model}/generate_stream",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as r:  # noqa: S310 (loopback)
            for raw in r:
                line = raw.decode()
                if line.startswith("data: "):
                    json.loads(line[6:])
                    counts[tag] += 1

    threads = [threading.Thread(target=one, args=(tag,)) for tag in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if sum(counts) != streams * responses:
        raise RuntimeError(f"got {sum(counts)} responses, expected {streams * responses}")
    return streams * responses / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=2000, help="per stream")
    parser.add_argument("--streams", default="1,4", help="concurrent streams, comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        write_stream_models(repo, Path(tmp))
        http_port, grpc_port = free_port(), free_port()
        log = (Path(tmp) / "server.log").open("wb")
        server = subprocess.Popen(
            [
                sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
                "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                "--metrics-port", "0", "--log-level", "WARNING",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{http_port}"
        try:
            # Our own process, on the port chosen now (never a stranger that took it).
            wait_until_serving(server.pid, http_port, exit_code=server.poll, timeout_s=60)
            before = rss_mib(server.pid)
            print(f"{'model':<14} {'protocol':<8} {'streams':>7} {'responses/s':>12}")
            for model in ("repeat_triton", "repeat_inferd"):
                for streams in (int(s) for s in args.streams.split(",")):
                    for protocol in ("grpc", "http"):
                        if protocol == "grpc":
                            rate = grpc_run(
                                f"127.0.0.1:{grpc_port}", model, streams, args.responses
                            )
                        else:
                            rate = http_run(url, model, streams, args.responses)
                        print(f"{model:<14} {protocol:<8} {streams:>7} {rate:>12,.0f}")
            check_still_serving(server.pid, http_port, server.poll)
            print(f"server RSS: {before:.0f} MiB before, {rss_mib(server.pid):.0f} MiB after")
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


if __name__ == "__main__":
    main()
