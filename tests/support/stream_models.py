"""Decoupled Python models for the streaming tests: one in Triton's style, one in inferd's, and
inferd's again in a worker process of its own (`isolation: "process"`).

All behave the same. Inputs: `N` responses to send (each `OUT` = TAG * 1000 + i and `IDX` =
i, the last one carrying the final flag; N = 0: the final flag alone), `TAG`, and optionally
`FAIL_AT` (that response is an error response instead) and `RAISE_AT` (the model raises
after sending that many). N = -1 sends one response, then waits until the client has gone:
it writes `<marker_dir>/cancelled-<TAG>`, sends three more responses (to be dropped) and the
final flag. A wait that sees no cancellation gives up after a minute, so that a failing test
cannot hang the server's shutdown. The worker-process model also takes `CRASH_AT`: its process
exits after sending that many responses.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

DROPPED_AFTER_CANCEL = 3

REPEAT_TRITON_PY = """
import json, os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker_dir = config["parameters"]["marker_dir"]["string_value"]

    def execute(self, requests):
        for request in requests:
            self.answer(request)
        return None

    def answer(self, request):
        def get(name, default):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return default if tensor is None else int(tensor.as_numpy().ravel()[0])

        n, tag = get("N", 0), get("TAG", 0)
        fail_at, raise_at = get("FAIL_AT", -1), get("RAISE_AT", -1)
        sender = request.get_response_sender()

        def response(i):
            return pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([tag * 1000 + i], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.int32)),
            ])

        if n < 0:
            sender.send(response(0))
            give_up = time.monotonic() + 60
            while not sender.is_cancelled() and time.monotonic() < give_up:
                threading.Event().wait(0.001)
            if sender.is_cancelled() and request.is_cancelled():
                with open(os.path.join(self.marker_dir, f"cancelled-{tag}"), "w") as f:
                    f.write("cancelled")
            for i in range(1, 4):
                sender.send(response(i))
            sender.send(flags=FINAL)
            return
        for i in range(n):
            if i == raise_at:
                raise pb_utils.TritonModelException(f"raised at {i}")
            if i == fail_at:
                answer = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"failed at {i}"))
            else:
                answer = response(i)
            sender.send(answer, flags=FINAL if i == n - 1 else 0)
        if n == 0:
            sender.send(flags=FINAL)
"""

REPEAT_INFERD_PY = """
import os, threading, time
import numpy as np


class Model:
    def load(self, context):
        self.marker_dir = context.parameters["marker_dir"]
        self.may_crash = context.parameters.get("may_crash") == "true"

    def predict_stream(self, inputs, responses):
        def get(name, default):
            x = inputs.get(name)
            return default if x is None else int(x.ravel()[0])

        n, tag = get("N", 0), get("TAG", 0)
        fail_at, raise_at = get("FAIL_AT", -1), get("RAISE_AT", -1)
        crash_at = get("CRASH_AT", -1) if self.may_crash else -1

        def response(i):
            return {"OUT": np.array([tag * 1000 + i], np.int32), "IDX": np.array([i], np.int32)}

        if n < 0:
            responses.send(response(0))
            give_up = time.monotonic() + 60
            while not responses.is_cancelled() and time.monotonic() < give_up:
                threading.Event().wait(0.001)
            if responses.is_cancelled():
                with open(os.path.join(self.marker_dir, f"cancelled-{tag}"), "w") as f:
                    f.write("cancelled")
            for i in range(1, 4):
                responses.send(response(i))
            responses.close()
            return
        for i in range(n):
            if i == crash_at:
                os._exit(1)
            if i == raise_at:
                raise RuntimeError(f"raised at {i}")
            if i == fail_at:
                responses.send_error(f"failed at {i}", final=i == n - 1)
            else:
                responses.send(response(i), final=i == n - 1)
        if n == 0:
            responses.close()
"""

REPEAT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "TAG", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "FAIL_AT", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "RAISE_AT", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "CRASH_AT", data_type: TYPE_INT32, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "IDX", data_type: TYPE_INT32, dims: [ 1 ] }}
]
instance_group [ {{ count: 3 }} ]
parameters {{ key: "marker_dir" value: {{ string_value: "{marker_dir}" }} }}
"""

ISOLATED = """\
parameters { key: "isolation" value: { string_value: "process" } }
parameters { key: "may_crash" value: { string_value: "true" } }
"""

# Not decoupled: generate and generate_stream answer it once.
UPPER_PY = """
import numpy as np


class Model:
    def predict(self, inputs):
        text = inputs["text_input"]
        upper = [t.upper() for t in text.ravel()]
        return {"text_output": np.array(upper, dtype=object).reshape(text.shape)}
"""

UPPER_CONFIG = """
name: "upper"
backend: "python"
max_batch_size: 0
input [ { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

REPEAT_MODELS = {
    "repeat_triton": REPEAT_TRITON_PY,
    "repeat_inferd": REPEAT_INFERD_PY,
    "repeat_isolated": REPEAT_INFERD_PY,
}


def write_model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    (repo / name / "config.pbtxt").write_text(config)


def write_stream_models(repo: Path, marker_dir: Path) -> None:
    for name, code in REPEAT_MODELS.items():
        config = REPEAT_CONFIG.format(name=name, marker_dir=marker_dir)
        if name == "repeat_isolated":  # two worker processes are enough
            config = config.replace("count: 3", "count: 2") + ISOLATED
        write_model(repo, name, code, config)
    write_model(repo, "upper", UPPER_PY, UPPER_CONFIG)
