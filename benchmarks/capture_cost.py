"""What capture costs a request: the event loop's share per call, and end to end.

    .venv/bin/python benchmarks/capture_cost.py --calls 20000 --requests 500 --rounds 5

1. `Capture.observe` per call (what `DataPlane.respond` adds; CPU time of the calling
   thread, which other processes' load does not inflate), on a real loaded version of a
   tiny ONNX model (tests/monitoring_models.py, [8, 4] FP32 in, [8, 4] + [8, 1] out): with
   `capture_sample_rate` 0, 1 with no `--capture-dir` (id + predicted classes kept for
   feedback), and 1 with `--capture-dir` (also offered to the writer's queue; the writer
   thread runs meanwhile, on the same cores).
2. The writer thread's CPU per capture (fingerprint, the shard's arrays and file, the index
   line), on a batch of 2,000 of those requests.
3. End to end: sequential v2 JSON requests from one client to three copies of the model in
   one server with `--capture-dir`, at rates 0, 0.01 and 1, in rounds that alternate
   between them so a change in the machine's load hits all three; the median over rounds
   of the mean time per request (wall, and CPU of the whole process: client, server and
   capture writer), and its ratio to rate 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.monitoring_models import parameters, write_signed_model  # noqa: E402
from tests.servers import run_server  # noqa: E402

from inferd.events import CallContext, RequestRecord  # noqa: E402
from inferd.monitoring.capture import Capture  # noqa: E402
from inferd.monitoring.capture_files import CapturedRequest  # noqa: E402
from inferd.monitoring.capture_options import CaptureSettings  # noqa: E402
from inferd.monitoring.capture_writer import CaptureWriter, DropCounts  # noqa: E402
from inferd.request_log import input_fingerprint  # noqa: E402
from inferd.types import InferRequest, InferResponse, Tensor  # noqa: E402

RATES = {"r0": 0, "r001": 0.01, "r1": 1}


def observe_us(capture: Capture, model: str, calls: int) -> float:
    x = np.ones((8, 4), np.float32)
    request = InferRequest(model, "", [Tensor("x", "FP32", (8, 4), x)])
    y = Tensor("y", "FP32", (8, 4), x)
    cls = Tensor("cls", "INT64", (8, 1), np.zeros((8, 1), np.int64))
    record = RequestRecord(model, "1", CallContext("http"), 0, request=request)
    started = time.thread_time()  # this thread's CPU: other processes' load does not count
    for _ in range(calls):
        capture.observe(record, InferResponse(model, "1", [y, cls]))
    return (time.thread_time() - started) / calls * 1e6


def writer_us(directory: Path, captures: int) -> float:
    """The writer thread's CPU per capture: fingerprint, shard, index line (one batch)."""
    x = np.ones((8, 4), np.float32)
    outputs = [
        Tensor("y", "FP32", (8, 4), x),
        Tensor("cls", "INT64", (8, 1), np.zeros((8, 1), np.int64)),
    ]
    batch = [
        CapturedRequest(
            f"w{i}", time.time(), "r1", "1", "http", [Tensor("x", "FP32", (8, 4), x)], outputs, 320
        )
        for i in range(captures)
    ]
    writer = CaptureWriter(CaptureSettings(directory, max_bytes=64 * 1024 * 1024), DropCounts())
    started = time.thread_time()
    for request in batch:
        request.fingerprint = input_fingerprint(request.inputs)
    writer.store(batch)
    return (time.thread_time() - started) / captures * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        for name, rate in RATES.items():
            write_signed_model(repo, name, extra=parameters(capture_sample_rate=rate))
        settings = CaptureSettings(Path(tmp) / "capture", max_bytes=64 * 1024 * 1024)
        with run_server(repo, capture=settings) as running:
            registry = running.server.registry
            bare, writing = Capture(registry), Capture(registry, settings)
            writing.start()
            micro: dict[str, list[float]] = {
                "rate 0": [],
                "rate 1": [],
                "rate 1, --capture-dir": [],
            }
            for _ in range(args.rounds):
                micro["rate 0"].append(observe_us(bare, "r0", args.calls))
                micro["rate 1"].append(observe_us(bare, "r1", args.calls))
                micro["rate 1, --capture-dir"].append(observe_us(writing, "r1", args.calls))
                writing.flush()
            writing.close()
            print("Capture.observe (the event loop's share), CPU µs per call (median of rounds):")
            for label, values in micro.items():
                print(f"  {label:<24} {statistics.median(values):7.2f}")
            stores = [writer_us(Path(tmp) / f"w{i}", 2000) for i in range(args.rounds)]
            print(f"The writer thread, CPU µs per capture: {statistics.median(stores):.1f}")
            doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8, 4], "data": [1] * 32}]}
            e2e: dict[str, list[float]] = {name: [] for name in RATES}
            cpu: dict[str, list[float]] = {name: [] for name in RATES}
            with httpx.Client(base_url=running.url) as http:
                for name in RATES:  # warm up
                    for _ in range(50):
                        http.post(f"/v2/models/{name}/infer", json=doc).raise_for_status()
                for _ in range(args.rounds):
                    for name in RATES:
                        started, cpu_started = time.perf_counter(), time.process_time()
                        for _ in range(args.requests):
                            http.post(f"/v2/models/{name}/infer", json=doc).raise_for_status()
                        e2e[name].append((time.perf_counter() - started) / args.requests * 1e6)
                        cpu[name].append((time.process_time() - cpu_started) / args.requests * 1e6)
            print("End to end, sequential JSON requests, µs per request (median of rounds):")
            for label, figures in (("wall", e2e), ("CPU, whole process", cpu)):
                base = statistics.median(figures["r0"])
                print(f" {label}:")
                for name, values in figures.items():
                    median = statistics.median(values)
                    print(f"  rate {RATES[name]:<5} {median:8.1f}  ({median / base:.3f} of rate 0)")


if __name__ == "__main__":
    main()
