"""Shared model definitions for the peer servers (imported from each peer's venv).

tiny: OUTPUT = INPUT[:, :16] * 2 on FP32 rows of 64 (pure server overhead).
mlp:  the example ONNX MLP 64->1024->1024->16 (examples/build_models.py, seed 0), run by
      onnxruntime with one intra-op thread; input "input" [batch,64] FP32, outputs
      "probabilities" [batch,16] FP32 and "label" [batch,1] INT64.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MLP_PATH = Path(
    os.environ.get("PEERS_MLP_ONNX", HERE / "results" / "models" / "mlp" / "1" / "model.onnx")
)

MAX_BATCH = 32
MAX_DELAY_S = 0.002

# name -> (inputs, outputs); each is a list of (name, dtype, per-row shape)
SIGNATURES = {
    "tiny": ([("INPUT", np.float32, (64,))], [("OUTPUT", np.float32, (16,))]),
    "mlp": (
        [("input", np.float32, (64,))],
        [("probabilities", np.float32, (16,)), ("label", np.int64, (1,))],
    ),
}


def tiny(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT": x[:, :16] * 2}


class Mlp:
    def __init__(self, path: Path | str = MLP_PATH) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        probabilities, label = self.session.run(["probabilities", "label"], {"input": x})
        # onnxruntime 1.32 (built for numpy 2) hands INT64 back with a dtype numpy 1.26 does not
        # see as np.int64 (char "Q"), which PyTriton's output validation rejects; view() fixes it.
        return {"probabilities": probabilities, "label": label.view(np.int64)}


def load(name: str):
    """A callable taking the [batch, 64] FP32 array and returning {output name: array}."""
    if name == "tiny":
        return tiny
    if name == "mlp":
        return Mlp()
    raise ValueError(f"unknown model {name!r}")


V2_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def v2_response(model_name: str, outputs: dict[str, np.ndarray]) -> dict:
    """A KServe v2 JSON response body for the servers without a v2 route of their own."""
    return {
        "model_name": model_name,
        "model_version": "1",
        "outputs": [
            {
                "name": name,
                "datatype": V2_DATATYPES[value.dtype],
                "shape": list(value.shape),
                "data": value.ravel().tolist(),
            }
            for name, value in outputs.items()
        ],
    }
