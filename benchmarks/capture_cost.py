"""What capture costs a request: the event loop's share per request, and the writer's.

    .venv/bin/python benchmarks/capture_cost.py --calls 20000 --rounds 7

1. `Capture.observe` per call (what `DataPlane.respond` adds; CPU time of the calling
   thread, which other processes' load does not inflate), on a real loaded version of a
   tiny ONNX model (tests/support/monitoring_models.py, [8, 4] FP32 in, [8, 4] + [8, 1] out): with
   `capture_sample_rate` 0, 1 with no `--capture-dir` (id + predicted classes kept for
   feedback), and 1 with `--capture-dir` (also offered to the writer's queue; the writer
   thread runs meanwhile, on the same cores).
2. The writer thread's CPU per capture (fingerprint, the shard's arrays and file, the index
   line), on a batch of 2,000 of those requests.

Rounds alternate between the cases; the figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.monitoring_models import parameters, write_signed_model  # noqa: E402

from inferd.dataplane.capture import Capture  # noqa: E402
from inferd.events import CallContext, RequestRecord, Telemetry  # noqa: E402
from inferd.monitoring.capture_files import CapturedRequest  # noqa: E402
from inferd.monitoring.capture_settings import CaptureSettings  # noqa: E402
from inferd.monitoring.capture_writer import CaptureWriter, DropCounts  # noqa: E402
from inferd.repository.registry import ModelRegistry  # noqa: E402
from inferd.telemetry.request_log import input_fingerprint  # noqa: E402
from inferd.types import InferRequest, InferResponse, Tensor  # noqa: E402

X = np.ones((8, 4), np.float32)
OUTPUTS = [
    Tensor("y", "FP32", (8, 4), X),
    Tensor("cls", "INT64", (8, 1), np.zeros((8, 1), np.int64)),
]


def observe_us(capture: Capture, model: str, calls: int) -> float:
    request = InferRequest(model, "", [Tensor("x", "FP32", (8, 4), X)])
    record = RequestRecord(model, "1", CallContext("http"), 0, request=request)
    started = time.thread_time()
    for _ in range(calls):
        capture.observe(record, InferResponse(model, "1", list(OUTPUTS)))
    return (time.thread_time() - started) / calls * 1e6


def writer_us(directory: Path, captures: int) -> float:
    batch = [
        CapturedRequest(
            f"w{i}", time.time(), "r1", "1", "http", [Tensor("x", "FP32", (8, 4), X)], OUTPUTS, 320
        )
        for i in range(captures)
    ]
    writer = CaptureWriter(CaptureSettings(directory, max_bytes=64 * 1024 * 1024), DropCounts())
    started = time.thread_time()
    for request in batch:
        request.fingerprint = input_fingerprint(request.inputs)
    writer.store(batch)
    return (time.thread_time() - started) / captures * 1e6


async def measure(calls: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_signed_model(repo, "r0")
        write_signed_model(repo, "r1", extra=parameters(capture_sample_rate=1))
        registry = ModelRegistry(repo, Telemetry(), 120_000)
        await registry.load_all()
        settings = CaptureSettings(Path(tmp) / "capture", max_bytes=64 * 1024 * 1024)
        bare, writing = Capture(registry), Capture(registry, settings)
        writing.start()
        cases = {"rate 0": [], "rate 1": [], "rate 1, --capture-dir": [], "writer": []}
        for i in range(rounds):
            cases["rate 0"].append(observe_us(bare, "r0", calls))
            cases["rate 1"].append(observe_us(bare, "r1", calls))
            cases["rate 1, --capture-dir"].append(observe_us(writing, "r1", calls))
            writing.flush()
            cases["writer"].append(writer_us(Path(tmp) / f"w{i}", 2000))
        writing.close()
        await registry.unload_all()
    print("CPU µs (median of rounds):")
    for label, values in cases.items():
        what = "per capture, the writer thread" if label == "writer" else f"observe, {label}"
        print(f"  {what:<40} {statistics.median(values):7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(measure(args.calls, args.rounds))


if __name__ == "__main__":
    main()
