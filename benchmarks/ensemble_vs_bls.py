"""An ensemble against the same three models called from one Python model (BLS), end to end
through a real server: `chain3`, an ensemble of copy_a -> copy_b -> copy_c (Python models
that copy their input; ensemble_overhead.py's), against `bls3`, one Python model whose
`predict` calls copy_a, copy_b and copy_c in turn through `ModelContext.infer`, and `one`, a
Python model making the three copies itself (no other model called). Sequential HTTP
requests, one of each case in turn (bls_overhead.py's `alternate`); the median of each, and
per step = (chain3 - the other) / 3.

.venv/bin/python benchmarks/ensemble_vs_bls.py [requests per case per round] [rounds]
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ensemble_overhead = _load("ensemble_overhead")  # the models
bls_overhead = _load("bls_overhead")  # the alternating client

BLS3 = """
from inferd import PythonModel


class Model(PythonModel):
    def load(self, context):
        self.context = context

    def predict(self, inputs):
        x = inputs["IN"]
        for model in ("copy_a", "copy_b", "copy_c"):
            x = self.context.infer(model, {"IN": x}, ["OUT"])["OUT"]
        return {"OUT": x}
"""
# Its warm-up would call models that may not be loaded yet.
NO_WARMUP = 'parameters { key: "auto_warmup" value: { string_value: "false" } }\n'

CASES = ["chain3", "bls3", "one"]


def write(repo: Path) -> None:
    models = {"copy_a": ensemble_overhead.COPY_PY, "copy_b": ensemble_overhead.COPY_PY,
              "copy_c": ensemble_overhead.COPY_PY, "one": ensemble_overhead.COPY3_PY,
              "bls3": BLS3}  # fmt: skip
    for name, code in models.items():
        (repo / name / "1").mkdir(parents=True)
        config = ensemble_overhead.COPY_CONFIG.format(name=name)
        (repo / name / "config.pbtxt").write_text(config + (NO_WARMUP if name == "bls3" else ""))
        (repo / name / "1" / "model.py").write_text(code)
    (repo / "chain3" / "1").mkdir(parents=True)
    (repo / "chain3" / "config.pbtxt").write_text(ensemble_overhead.CHAIN3)


def main(per_round: int, rounds: int) -> None:
    values = [float(i) for i in range(16)]
    body = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 16], "data": values}]}
    )
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write(repo)
        times = bls_overhead.alternate(repo, CASES, body, values, per_round, rounds)
    median = {case: statistics.median(t) * 1e6 for case, t in times.items()}
    for case in CASES:
        print(f"{case:8} median {median[case]:8.1f} us  ({len(times[case])} requests)")
    for other in ("bls3", "one"):
        step = (median["chain3"] - median[other]) / 3
        print(f"per step, chain3 against {other:4}: {step:8.1f} us")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 300, int(sys.argv[2]) if len(sys.argv) > 2 else 3
    )
