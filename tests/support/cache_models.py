"""Models for the response cache's tests: each answer says which execution made it (`EXEC`,
1, 2, ... per instance), so a test reads "served from the cache" straight off the answer
and "executed once" off the server's own statistics."""

from __future__ import annotations

import textwrap
from pathlib import Path

# Echoes IN (FP32 or BYTES, per the config) and the number of the execution that served it;
# with a `gate_path`, each execution waits while that file exists (at most 60 s).
EXEC_PY = """
import itertools, os, time
import numpy as np

BUMP = 0.0  # differs per version file in the version swap tests

class Model:
    def load(self, context):
        self.delay_s = float(context.parameters.get("delay_ms", "0")) / 1000
        self.offset = float(context.parameters.get("offset", "0"))
        self.gate = context.parameters.get("gate_path", "")
        self.ids = itertools.count(1)

    def predict(self, inputs):
        x = inputs["IN"]
        if self.delay_s:
            time.sleep(self.delay_s)
        give_up = time.monotonic() + 60
        while self.gate and os.path.exists(self.gate) and time.monotonic() < give_up:
            time.sleep(0.002)
        exec_id = next(self.ids)
        out = x + self.offset + BUMP if x.dtype != object else x
        return {"OUT": out, "EXEC": np.full((x.shape[0], 1), exec_id, dtype=np.int64)}
"""

EXEC_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "IN", data_type: {datatype}, dims: [ -1 ] }} ]
output [
  {{ name: "OUT", data_type: {datatype}, dims: [ -1 ] }},
  {{ name: "EXEC", data_type: TYPE_INT64, dims: [ 1 ] }}
]
dynamic_batching {{ }}
{cache}
parameters {{ key: "delay_ms" value: {{ string_value: "{delay_ms}" }} }}
parameters {{ key: "offset" value: {{ string_value: "{offset}" }} }}
{extra}
"""

CACHED = "response_cache { enable: true }"

# A Triton Python model whose responses carry parameters (InferenceResponse(parameters=)):
# a hit must answer with them too.
PARAMS_PY = """
import itertools
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.ids = itertools.count(1)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            n = next(self.ids)
            out = pb_utils.Tensor("OUT", x)
            responses.append(
                pb_utils.InferenceResponse([out], parameters={"execution": n})
            )
        return responses
"""

PARAMS_CONFIG = """
name: "with_params"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]
response_cache { enable: true }
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'


def write_exec_model(
    repo: Path,
    name: str,
    *,
    cached: bool = True,
    datatype: str = "TYPE_FP32",
    delay_ms: int = 0,
    offset: float = 0.0,
    extra: str = "",
    version: str = "1",
    bump: float = 0.0,
    gate: Path | None = None,
) -> None:
    if gate is not None:
        extra += param("gate_path", str(gate))
    config = EXEC_CONFIG.format(
        name=name,
        datatype=datatype,
        cache=CACHED if cached else "",
        delay_ms=delay_ms,
        offset=offset,
        extra=extra,
    )
    _write(repo / name / "config.pbtxt", config)
    _write(repo / name / version / "model.py", EXEC_PY.replace("BUMP = 0.0", f"BUMP = {bump}"))


def write_params_model(repo: Path) -> None:
    _write(repo / "with_params" / "config.pbtxt", PARAMS_CONFIG)
    _write(repo / "with_params" / "1" / "model.py", PARAMS_PY)
