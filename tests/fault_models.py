"""Python models for the overload and fault tests: slow, recording, switchable."""

from __future__ import annotations

import textwrap
from pathlib import Path

# Sleeps `delay_ms` per batch and appends every executed value to `record_path`, so a test
# can tell which requests really ran and in which order.
RECORDING_PY = """
import time
import numpy as np

class Model:
    def load(self, context):
        self.delay_s = float(context.parameters.get("delay_ms", "0")) / 1000
        self.path = context.parameters.get("record_path", "")

    def predict(self, inputs):
        x = inputs["IN"]
        if (x >= 0).all():  # warm-up sends zeros: not recorded
            time.sleep(self.delay_s)
        if self.path and (x > 0).any():
            with open(self.path, "a") as f:
                for value in x.ravel():
                    f.write(f"{int(value)}\\n")
        return {"OUT": x.copy()}
"""

# Fails while the file `flag_path` exists: the primary of the circuit-breaker test.
SWITCHABLE_PY = """
import os
import numpy as np

class Model:
    def load(self, context):
        self.flag = context.parameters["flag_path"]

    def predict(self, inputs):
        x = inputs["IN"]
        if os.path.exists(self.flag) and (x != 0).any():
            raise RuntimeError("the primary is failing on purpose")
        return {"OUT": x + 1}
"""

CONSTANT_PY = """
import numpy as np

class Model:
    def predict(self, inputs):
        return {"OUT": np.full(inputs["IN"].shape, 100.0, dtype=np.float32)}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
{extra}
"""


def write_model(repo: Path, name: str, code: str, extra: str = "", max_batch_size: int = 1) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(
        CONFIG.format(name=name, max_batch_size=max_batch_size, extra=textwrap.dedent(extra))
    )
    (repo / name / "1" / "model.py").write_text(code)


def param(key: str, value: object) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
