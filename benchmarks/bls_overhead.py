"""What one BLS call costs a Python model, end to end through a real server: a
`TritonPythonModel` that computes `2 * IN + 1` itself (`local_*`) against one that asks the
`double` model for `2 * IN` with `InferenceRequest(...).exec()` and adds one (`relay_*`),
in the server process and with `isolation: "process"`. Sequential HTTP requests, one of
each case in turn (the machine is noisy: the noise hits every case alike); the median of
each case, and the difference: the call's cost (the called model's own scheduling and
execution included).

.venv/bin/python benchmarks/bls_overhead.py [requests per case per round] [rounds]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import run_server  # noqa: E402

CODE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN")
            if {call}:
                got = pb_utils.InferenceRequest(
                    model_name="double", inputs=[x], requested_output_names=["OUT"]
                ).exec()
                out = got.output_tensors()[0].as_numpy() + 1
            else:
                out = x.as_numpy() * 2 + 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

DOUBLE = """
class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"] * 2}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
{extra}
"""

CASES = ["local_inproc", "relay_inproc", "local_process", "relay_process"]


def write(repo: Path, name: str, code: str, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def main(per_round: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write(repo, "double", DOUBLE)
        process = 'parameters { key: "isolation" value: { string_value: "process" } }'
        for case in CASES:
            extra = process if case.endswith("process") else ""
            write(repo, case, CODE.format(call=case.startswith("relay")), extra)
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [3]}]}
        times: dict[str, list[float]] = {case: [] for case in CASES}
        with run_server(repo) as server, httpx.Client(base_url=server.url) as client:
            for case in CASES:  # warm up each path
                for _ in range(50):
                    client.post(f"/v2/models/{case}/infer", json=body).raise_for_status()
            for _ in range(rounds * per_round):
                for case in CASES:  # one request of each case in turn: the noise hits all
                    start = time.perf_counter()
                    r = client.post(f"/v2/models/{case}/infer", json=body)
                    times[case].append(time.perf_counter() - start)
                    assert r.json()["outputs"][0]["data"] == [7.0], r.text
        median = {case: statistics.median(t) * 1e6 for case, t in times.items()}
        for case in CASES:
            print(f"{case:14} median {median[case]:8.1f} us  ({len(times[case])} requests)")
        for iso in ("inproc", "process"):
            cost = median[f"relay_{iso}"] - median[f"local_{iso}"]
            print(f"one BLS call, {iso:7}: {cost:8.1f} us")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(sys.argv[2]) if len(sys.argv) > 2 else 3
    )
