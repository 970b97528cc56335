"""A model's in-process ceiling: ONNX Runtime alone, one thread, no server.

.venv/bin/python benchmarks/mlp_inprocess.py [seconds per batch size] [MODEL.onnx]

The model defaults to the example MLP; any ONNX model with one FP32 [batch, 64] input works
(the peers' tiny model: benchmarks/peers/results/inferd_repo/tiny/1/model.onnx).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import onnxruntime as ort

MODEL = "examples/models/mlp/1/model.onnx"


def rows_per_second(session: ort.InferenceSession, batch: int, seconds: float) -> float:
    x = np.random.default_rng(0).normal(size=(batch, 64)).astype(np.float32)
    feed = {session.get_inputs()[0].name: x}
    for _ in range(50):
        session.run(None, feed)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, feed)
        runs += 1
    return runs * batch / (time.perf_counter() - start)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    model = sys.argv[2] if len(sys.argv) > 2 else MODEL
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for batch in (1, 8, 32):
        print(f"batch {batch:>2}: {rows_per_second(session, batch, seconds):>9,.0f} rows/s")


if __name__ == "__main__":
    main()
