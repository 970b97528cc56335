"""What an ensemble's steps cost, in process (no wire: the same steps an adapter takes, from
`DataPlane.start` on, through `DataPlane.internal.call_model`):

- `recall_rank` (the example ensemble: recall -> rank -> topk, three schedulers) against
  `fused`, one Python model doing the same three stages in one `predict` (the same table, the
  same ONNX ranker, the same top-k);
- `chain3`, an ensemble of three Python models that each copy their input, against `one`, a
  single model making the three copies: what a step costs when the models do no work.

One request at a time, the two of each pair alternating, so the machine's noise hits both;
per step = (ensemble - the one model) / 3, in wall time (median) and in CPU time (mean).
And `chain3` against its three models called one after the other by the caller: what the
ensemble itself adds per step, beyond the steps' own requests.

.venv/bin/python benchmarks/ensemble_overhead.py [rounds]
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

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

FUSED_PY = """
import numpy as np
import onnxruntime as ort

from inferd import PythonModel


class Model(PythonModel):
    def load(self, context):
        rng = np.random.default_rng(17)
        table = rng.standard_normal((100000, 64), dtype=np.float32)
        table /= np.linalg.norm(table, axis=1, keepdims=True)
        self.table = table
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.rank = ort.InferenceSession(str(context.version_dir / "rank.onnx"), options)

    def predict(self, inputs):
        users = inputs["USER"]
        scores = users @ self.table.T
        top = np.argpartition(scores, -200, axis=1)[:, -200:]
        vecs = self.table[top]
        ranked = self.rank.run(None, {"USER": users, "CANDIDATE_VECS": vecs})[0]
        best = np.argsort(-ranked, axis=1, kind="stable")[:, :10]
        return {
            "IDS": np.take_along_axis(top.astype(np.int64), best, axis=1),
            "SCORES": np.take_along_axis(ranked, best, axis=1),
        }
"""

FUSED_CONFIG = """
name: "fused"
backend: "python"
max_batch_size: 32
input [ { name: "USER", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [
  { name: "IDS", data_type: TYPE_INT64, dims: [ 10 ] },
  { name: "SCORES", data_type: TYPE_FP32, dims: [ 10 ] }
]
dynamic_batching { }
"""

COPY_PY = """
from inferd import PythonModel


class Model(PythonModel):
    def predict(self, inputs):
        return {"OUT": inputs["IN"].copy()}
"""

# The three copies of chain3's steps in one predict.
COPY3_PY = """
from inferd import PythonModel


class Model(PythonModel):
    def predict(self, inputs):
        return {"OUT": inputs["IN"].copy().copy().copy()}
"""

COPY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 16 ] }} ]
dynamic_batching {{ }}
"""

CHAIN3 = """
name: "chain3"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "copy_a" model_version: -1 input_map { key: "IN" value: "IN" }
    output_map { key: "OUT" value: "a" } },
  { model_name: "copy_b" model_version: -1 input_map { key: "IN" value: "a" }
    output_map { key: "OUT" value: "b" } },
  { model_name: "copy_c" model_version: -1 input_map { key: "IN" value: "b" }
    output_map { key: "OUT" value: "OUT" } }
] }
"""


def build(repo: Path) -> None:
    spec = importlib.util.spec_from_file_location("build_models", EXAMPLES / "build_models.py")
    assert spec is not None and spec.loader is not None
    builders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builders)
    for name in ("recall", "rank", "topk", "recall_rank"):
        shutil.copytree(EXAMPLES / "models" / name, repo / name)
    ranker = builders.ranker(64, 200, 32, seed=3)
    builders._save(ranker, repo / "rank" / "1" / "model.onnx")
    (repo / "fused" / "1").mkdir(parents=True)
    (repo / "fused" / "config.pbtxt").write_text(FUSED_CONFIG)
    (repo / "fused" / "1" / "model.py").write_text(FUSED_PY)
    shutil.copy(repo / "rank" / "1" / "model.onnx", repo / "fused" / "1" / "rank.onnx")
    for name in ("copy_a", "copy_b", "copy_c", "one"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(COPY_CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(COPY3_PY if name == "one" else COPY_PY)
    (repo / "chain3" / "1").mkdir(parents=True)
    (repo / "chain3" / "config.pbtxt").write_text(CHAIN3)


async def measure(repo: Path, rounds: int) -> None:
    telemetry = Telemetry()
    registry = ModelRegistry(repo, telemetry)
    await registry.load_all()
    dataplane = DataPlane(registry, telemetry)
    users = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    small = np.ones((1, 16), np.float32)

    async def once(model: str, name: str, x: np.ndarray) -> tuple[int, int]:
        """(wall, CPU) ns of one request. CPU is the whole process's (the event loop and the
        instances' threads): one request at a time, it is this request's, and the other
        processes on a shared machine do not inflate it as they do the wall time."""
        request = InferRequest(model, "", [Tensor(name, "FP32", x.shape, x)])
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        await dataplane.internal.call_model(request, CallContext("bench"))
        return time.perf_counter_ns() - start, time.process_time_ns() - cpu

    async def three(x: np.ndarray) -> tuple[int, int]:
        """copy_a, copy_b, copy_c called one after the other by the caller: chain3's steps
        without the ensemble around them."""
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for model in ("copy_a", "copy_b", "copy_c"):
            request = InferRequest(model, "", [Tensor("IN", "FP32", x.shape, x)])
            x = (await dataplane.internal.call_model(request, CallContext("bench"))).outputs[0].data
        return time.perf_counter_ns() - start, time.process_time_ns() - cpu

    wall3: list[int] = []
    chain_wall: list[int] = []
    cpu3 = chain_cpu = 0
    for k in range(rounds + 20):
        w, c = await three(small)
        cw, cc = await once("chain3", "IN", small)
        if k >= 20:  # after a warm-up
            wall3.append(w)
            chain_wall.append(cw)
            cpu3 += c
            chain_cpu += cc
    m3, mc = statistics.median(wall3) / 1000, statistics.median(chain_wall) / 1000
    print(
        f"chain3       wall p50 {mc:8.1f} us, CPU {chain_cpu / rounds / 1000:8.1f} us | 3 calls "
        f"wall p50 {m3:8.1f} us, CPU {cpu3 / rounds / 1000:8.1f} us | the ensemble itself per "
        f"step: wall {(mc - m3) / 3:6.1f} us, CPU {(chain_cpu - cpu3) / rounds / 3000:6.1f} us"
    )

    pairs = [("recall_rank", "fused", "USER", users), ("chain3", "one", "IN", small)]
    for ensemble, alone, name, x in pairs:
        for _ in range(20):  # warm-up
            await once(ensemble, name, x)
            await once(alone, name, x)
        wall: dict[str, list[int]] = {ensemble: [], alone: []}
        cpu: dict[str, int] = {ensemble: 0, alone: 0}
        for _ in range(rounds):
            for model in (ensemble, alone):
                w, c = await once(model, name, x)
                wall[model].append(w)
                cpu[model] += c
        med = {m: statistics.median(v) / 1000 for m, v in wall.items()}
        mean_cpu = {m: c / rounds / 1000 for m, c in cpu.items()}
        print(
            f"{ensemble:12s} wall p50 {med[ensemble]:8.1f} us, CPU {mean_cpu[ensemble]:8.1f} us"
            f" | {alone:6s} wall p50 {med[alone]:8.1f} us, CPU {mean_cpu[alone]:8.1f} us"
            f" | per step: wall {(med[ensemble] - med[alone]) / 3:6.1f} us, CPU "
            f"{(mean_cpu[ensemble] - mean_cpu[alone]) / 3:6.1f} us ({rounds} rounds)"
        )
    await registry.unload_all()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory(prefix="inferd-ensemble-bench-") as tmp:
        repo = Path(tmp)
        build(repo)
        asyncio.run(measure(repo, rounds))


if __name__ == "__main__":
    main()
