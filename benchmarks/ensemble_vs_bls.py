"""An ensemble against the same three models called from one Python model (BLS), end to end
through a real server: `chain3`, an ensemble of copy_a -> copy_b -> copy_c (Python models
that copy their input), against `bls3`, one Python model whose `predict` calls copy_a,
copy_b and copy_c in turn through `ModelContext.infer`, and `one`, a Python model making the
three copies itself (no other model called). Sequential HTTP requests over one keep-alive
connection, one of each case in turn (the machine is noisy: the noise hits every case
alike); the median of each, and per step = (chain3 - the other) / 3.

.venv/bin/python benchmarks/ensemble_vs_bls.py [requests per case per round] [rounds]
"""

from __future__ import annotations

import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server_process import check_still_serving, free_port, wait_until_serving  # noqa: E402

COPY = """
class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"].copy()}
"""

ONE = """
class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"].copy().copy().copy()}
"""

BLS3 = """
class Model:
    def load(self, context):
        self.context = context

    def predict(self, inputs):
        x = inputs["IN"]
        for model in ("copy_a", "copy_b", "copy_c"):
            x = self.context.infer(model, {"IN": x}, ["OUT"])["OUT"]
        return {"OUT": x}
"""

CONFIG = """
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

CASES = ["chain3", "bls3", "one"]


def write(repo: Path) -> None:
    for name, code in [("copy_a", COPY), ("copy_b", COPY), ("copy_c", COPY), ("one", ONE),
                       ("bls3", BLS3)]:  # fmt: skip
        (repo / name / "1").mkdir(parents=True)
        config = CONFIG.format(name=name)
        if name == "bls3":  # its warm-up would call models that may not be loaded yet
            config += 'parameters { key: "auto_warmup" value: { string_value: "false" } }\n'
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(code)
    (repo / "chain3" / "1").mkdir(parents=True)
    (repo / "chain3" / "config.pbtxt").write_text(CHAIN3)


def main(per_round: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write(repo)
        values = [float(i) for i in range(16)]
        body = json.dumps(
            {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 16], "data": values}]}
        )
        port = free_port()
        server = subprocess.Popen(
            [
                sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
                "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
                "--log-level", "WARNING",
            ],
        )  # fmt: skip
        times: dict[str, list[float]] = {case: [] for case in CASES}
        try:
            wait_until_serving(server.pid, port, exit_code=server.poll, timeout_s=120)
            client = http.client.HTTPConnection("127.0.0.1", port)  # one keep-alive connection

            def infer(case: str) -> float:
                start = time.perf_counter()
                client.request("POST", f"/v2/models/{case}/infer", body)
                answer = client.getresponse().read()
                took = time.perf_counter() - start
                assert json.loads(answer)["outputs"][0]["data"] == values, answer
                return took

            for case in CASES:  # warm up each path
                for _ in range(50):
                    infer(case)
            for _ in range(rounds * per_round):
                for case in CASES:  # one request of each case in turn: the noise hits all
                    times[case].append(infer(case))
            check_still_serving(server.pid, port, server.poll)
        finally:
            server.terminate()
            server.wait(timeout=30)
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
