"""Python models for the overload and fault tests: slow, recording, switchable, gated."""

from __future__ import annotations

import textwrap
from pathlib import Path

from inferd.scheduling.batcher import DynamicBatcher
from tests.support.models import COUNTER_CONFIG

# Sleeps `delay_ms` per batch and appends every executed value to `record_path`, so a test
# can tell which requests really ran and in which order. With `gate_path`, a request also
# waits, before it records and answers, while that file exists: a test holds the model's
# only instance busy for exactly as long as it needs (no race against a fixed delay), then
# releases it. The wait gives up after a minute so that a test which fails before releasing
# cannot hang the server's shutdown.
RECORDING_PY = """
import os
import time
import numpy as np

class Model:
    def load(self, context):
        self.delay_s = float(context.parameters.get("delay_ms", "0")) / 1000
        self.path = context.parameters.get("record_path", "")
        self.gate = context.parameters.get("gate_path", "")

    def predict(self, inputs):
        x = inputs["IN"]
        if (x >= 0).all():  # warm-up sends zeros: not recorded
            time.sleep(self.delay_s)
        if self.gate and (x > 0).any():
            give_up = time.monotonic() + 60
            while os.path.exists(self.gate) and time.monotonic() < give_up:
                time.sleep(0.002)
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


# The counter with a gate: a request holding a negative value (the blocker) keeps the
# model's one instance busy while the file `gate_path` exists (the gate is closed). While it
# is held, arrivals can only queue, so a test decides exactly what the next batch holds,
# however slowly its requests arrive.
GATED_COUNTER_PY = """
import itertools, os, time
import numpy as np

class Model:
    def load(self, context):
        self.gate = context.parameters["gate_path"]
        self.ids = itertools.count(1)

    def predict(self, inputs):
        x = inputs["IN"]
        n = x.shape[0]
        if (x < 0).any():
            deadline = time.monotonic() + 60  # never hold the instance forever
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.002)
        exec_id = next(self.ids)
        return {
            "OUT": x,
            "EXEC": np.full((n, 1), exec_id, dtype=np.int64),
            "BATCH": np.full((n, 1), n, dtype=np.int64),
        }
"""

GATED = "gated_counter"  # max_batch_size 64, one instance
GATED_MAX_BATCH = 64


def write_gated_counter(repo: Path, gate: Path) -> None:
    model = repo / GATED
    (model / "1").mkdir(parents=True)
    config = COUNTER_CONFIG.format(name=GATED, delay_ms=0)
    config += "instance_group [ { count: 1, kind: KIND_CPU } ]\n" + param("gate_path", gate)
    (model / "config.pbtxt").write_text(config, encoding="utf-8")
    (model / "1" / "model.py").write_text(GATED_COUNTER_PY, encoding="utf-8")


def blocker_is_executing(batcher: DynamicBatcher) -> bool:
    """The blocker has left the queue and holds the instance; nothing else is in flight."""
    return batcher.queue_depth() == 0 and batcher.inflight() == 1
