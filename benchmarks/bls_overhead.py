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

import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.server_process import check_still_serving, free_port, wait_until_serving  # noqa: E402

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


def alternate(
    repo: Path, cases: list[str], body: str, expect: list[float], per_round: int, rounds: int
) -> dict[str, list[float]]:
    """Serve `repo` and send `body` to each of `cases` in turn, one request of each case
    after the other over one keep-alive HTTP connection (the noise hits every case alike),
    each answer checked against `expect`: the seconds each request took, per case."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
            "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
            "--log-level", "WARNING",
        ],
    )  # fmt: skip
    times: dict[str, list[float]] = {case: [] for case in cases}
    try:
        wait_until_serving(server.pid, port, exit_code=server.poll, timeout_s=120)
        client = http.client.HTTPConnection("127.0.0.1", port)

        def infer(case: str) -> float:
            start = time.perf_counter()
            client.request("POST", f"/v2/models/{case}/infer", body)
            answer = client.getresponse().read()
            took = time.perf_counter() - start
            assert json.loads(answer)["outputs"][0]["data"] == expect, answer
            return took

        for case in cases:  # warm up each path
            for _ in range(50):
                infer(case)
        for _ in range(rounds * per_round):
            for case in cases:
                times[case].append(infer(case))
        check_still_serving(server.pid, port, server.poll)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return times


def main(per_round: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write(repo, "double", DOUBLE)
        process = 'parameters { key: "isolation" value: { string_value: "process" } }'
        for case in CASES:
            extra = process if case.endswith("process") else ""
            write(repo, case, CODE.format(call=case.startswith("relay")), extra)
        body = json.dumps(
            {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [3]}]}
        )
        times = alternate(repo, CASES, body, [7.0], per_round, rounds)
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
