"""The ensemble tests' models (tests/integration/pipelines/test_ensembles.py): small Python models
that
compute one operation on `IN` [-1, 1] FP32, record each execution's values (one line per
execute call, so a test counts calls and rows per call), and may wait on a gate file; and
ensembles of them."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.fault_models import param

# `op`: double, add_ten, square or unlucky (fails on 13). Warm-up sends zeros: not recorded.
OP_PY = """
import os
import time
import numpy as np

OPS = {
    "double": lambda x: x * 2,
    "add_ten": lambda x: x + 10,
    "square": lambda x: x * x,
    "unlucky": lambda x: x,
}

class Model:
    def load(self, context):
        p = context.parameters
        self.op = OPS[p["op"]]
        self.unlucky = p["op"] == "unlucky"
        self.path = p.get("record_path", "")
        self.gate = p.get("gate_path", "")
        self.delay_s = float(p.get("delay_ms", "0")) / 1000
        self.touch = p.get("touch_path", "")
        self.await_path = p.get("await_path", "")

    def predict(self, inputs):
        x = inputs["IN"]
        live = bool((x != 0).any())
        if live and self.touch:  # first: says this execution started
            open(self.touch, "a").close()
        if live and self.delay_s:
            time.sleep(self.delay_s)
        if live and self.gate:
            give_up = time.monotonic() + 60
            while os.path.exists(self.gate) and time.monotonic() < give_up:
                time.sleep(0.002)
        if live and self.await_path:
            give_up = time.monotonic() + 15  # bounded: a file that never comes fails the step
            while not os.path.exists(self.await_path):
                if time.monotonic() > give_up:
                    raise TimeoutError(f"{self.await_path} never came")
                time.sleep(0.002)
            os.remove(self.await_path)
        if live and self.path:
            with open(self.path, "a") as f:
                f.write(" ".join(str(float(v)) for v in x.ravel()) + "\\n")
        if self.unlucky and (x == 13).any():
            raise ValueError("13 is unlucky")
        return {"OUT": self.op(x).astype(x.dtype)}
"""

# OUT = A + B: the join of the diamond.
ADD_PY = """
import numpy as np

class Model:
    def predict(self, inputs):
        return {"OUT": (inputs["A"] + inputs["B"]).astype(np.float32)}
"""

# OUT = IN * the request's `scale` parameter (a Triton Python model reads its requests').
SCALE_PY = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            scale = float(json.loads(request.parameters()).get("scale", 1))
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", (x * scale).astype(x.dtype))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

OP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
dynamic_batching {{ {batching} }}
"""

ADD_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 64
input [
  {{ name: "A", data_type: TYPE_FP32, dims: [ -1 ] }},
  {{ name: "B", data_type: TYPE_FP32, dims: [ -1 ] }}
]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }} ]
"""


def write_op(
    repo: Path,
    name: str,
    op: str,
    records: Path,
    gates: Path | None = None,
    dims: str = "-1",
    batching: str = "",
    data_type: str = "TYPE_FP32",
    **extra: object,
) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    params = param("op", op) + param("record_path", records / name)
    if gates is not None:
        params += param("gate_path", gates / name)
    for key, value in extra.items():
        params += param(key, value)
    (repo / name / "config.pbtxt").write_text(
        OP_CONFIG.format(name=name, dims=dims, batching=batching).replace("TYPE_FP32", data_type)
        + params
    )
    (repo / name / "1" / "model.py").write_text(OP_PY)


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    ins = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return (
        f'{{ model_name: "{model}" model_version: {version} '
        f"input_map [ {ins} ] output_map [ {outs} ] }}"
    )


def ensemble_config(
    name: str,
    steps: list[str],
    max_batch_size: int = 8,
    in_dims: str = "-1",
    out_type: str = "TYPE_FP32",
    extra: str = "",
) -> str:
    return (
        textwrap.dedent(
            f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: {max_batch_size}
        input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ {in_dims} ] }} ]
        output [ {{ name: "OUT", data_type: {out_type}, dims: [ -1 ] }} ]
        ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
        """
        )
        + extra
    )


def write_ensemble(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)  # an ensemble's version is empty
    (repo / name / "config.pbtxt").write_text(config)


def chain(name: str, models: list[str], max_batch_size: int = 8) -> str:
    """IN -> models[0] -> models[1] -> ... -> OUT."""
    steps = []
    for k, model in enumerate(models):
        src = "IN" if k == 0 else f"t{k}"
        dst = "OUT" if k == len(models) - 1 else f"t{k + 1}"
        steps.append(step(model, {"IN": src}, {"OUT": dst}))
    return ensemble_config(name, steps, max_batch_size)


def write_ensemble_models(root: Path) -> None:
    """root/models (served), root/records, root/gates."""
    repo, records, gates = root / "models", root / "records", root / "gates"
    for d in (repo, records, gates):
        d.mkdir(parents=True)
    write_op(repo, "double", "double", records, delay_ms=20)
    write_op(repo, "add_ten", "add_ten", records)
    write_op(repo, "square", "square", records)
    write_op(repo, "unlucky", "unlucky", records)
    write_op(repo, "single", "double", records, dims="1")  # one value a row
    (repo / "add" / "1").mkdir(parents=True)
    (repo / "add" / "config.pbtxt").write_text(ADD_CONFIG.format(name="add"))
    (repo / "add" / "1" / "model.py").write_text(ADD_PY)
    write_ensemble(repo, "chain", chain("chain", ["double", "add_ten", "square"]))
    write_ensemble(repo, "failing", chain("failing", ["double", "unlucky", "square"]))
    # Its input is [-1] wide, its step's [1]: a wider request passes the ensemble's check and
    # fails the step's.
    write_ensemble(repo, "narrow", chain("narrow", ["single"]))
    diamond = [
        step("double", {"IN": "IN"}, {"OUT": "a"}),
        step("add_ten", {"IN": "IN"}, {"OUT": "b"}),
        step("add", {"A": "a", "B": "b"}, {"OUT": "OUT"}),
    ]
    write_ensemble(repo, "diamond", ensemble_config("diamond", diamond))
    (repo / "scale" / "1").mkdir(parents=True)
    (repo / "scale" / "config.pbtxt").write_text(
        OP_CONFIG.format(name="scale", dims="-1", batching="")
    )
    (repo / "scale" / "1" / "model.py").write_text(SCALE_PY)
    write_ensemble(repo, "scaled", chain("scaled", ["double", "scale"]))
    branch_fails = [
        step("double", {"IN": "IN"}, {"OUT": "a"}),
        step("unlucky", {"IN": "IN"}, {"OUT": "b"}),
        step("add", {"A": "a", "B": "b"}, {"OUT": "OUT"}),
    ]
    write_ensemble(repo, "diamond_fails", ensemble_config("diamond_fails", branch_fails))
    # Per protocol (a gated model must not have timed an execution before its test): a
    # three-step chain whose middle step waits on its gate.
    for protocol in ("http", "grpc"):
        for kind in ("deadline", "cancel"):
            tag = f"{kind}_{protocol}"
            write_op(repo, f"first_{tag}", "double", records)
            write_op(repo, f"held_{tag}", "add_ten", records, gates)
            write_op(repo, f"last_{tag}", "square", records)
            models = [f"first_{tag}", f"held_{tag}", f"last_{tag}"]
            write_ensemble(repo, f"pipe_{tag}", chain(f"pipe_{tag}", models))
        # A gated step whose queue holds one request: the ensemble's request is shed.
        queue = "default_queue_policy { max_queue_size: 1 }"
        write_op(repo, f"busy_{protocol}", "double", records, gates, batching=queue)
        write_ensemble(repo, f"shed_{protocol}", chain(f"shed_{protocol}", [f"busy_{protocol}"]))
        write_dataflow(repo, protocol, records, gates)
        # IN -> held (gated) -> after -> c and IN -> unlucky -> b, then add(c, b): unlucky
        # fails once held executes (held's file says so), so the answer comes while held
        # runs, and after (waiting for held) never starts.
        running = gates / f"held_running_{protocol}"
        write_op(repo, f"held_branch_{protocol}", "double", records, gates, touch_path=running)
        write_op(repo, f"unlucky_branch_{protocol}", "unlucky", records, await_path=running)
        write_op(repo, f"after_branch_{protocol}", "square", records)
        branches = [
            step(f"held_branch_{protocol}", {"IN": "IN"}, {"OUT": "a"}),
            step(f"unlucky_branch_{protocol}", {"IN": "IN"}, {"OUT": "b"}),
            step(f"after_branch_{protocol}", {"IN": "a"}, {"OUT": "c"}),
            step("add", {"A": "c", "B": "b"}, {"OUT": "OUT"}),
        ]
        name = f"branches_{protocol}"
        write_ensemble(repo, name, ensemble_config(name, branches))


def write_dataflow(repo: Path, protocol: str, records: Path, gates: Path) -> None:
    """`dataflow_<protocol>`: IN -> fast -> a -> after -> OUT and IN -> slow -> OUT2, where
    `slow` waits (boundedly) for a file that `after` creates: run in waves (fast and slow,
    then after), slow waits for a step that cannot start, and fails; run as dataflow (after
    starts once fast is done), it answers."""
    signal = gates / f"after_ran_{protocol}"
    write_op(repo, f"fast_{protocol}", "double", records)
    write_op(repo, f"after_{protocol}", "add_ten", records, touch_path=signal)
    write_op(repo, f"slow_{protocol}", "square", records, await_path=signal)
    steps = [
        step(f"fast_{protocol}", {"IN": "IN"}, {"OUT": "a"}),
        step(f"slow_{protocol}", {"IN": "IN"}, {"OUT": "OUT2"}),
        step(f"after_{protocol}", {"IN": "a"}, {"OUT": "OUT"}),
    ]
    second = 'output [ { name: "OUT2", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
    name = f"dataflow_{protocol}"
    write_ensemble(repo, name, ensemble_config(name, steps, extra=second))


def calls(root: Path, model: str) -> list[list[float]]:
    """The values of each execute call of `model`, in order."""
    path = root / "records" / model
    if not path.exists():
        return []
    return [[float(v) for v in line.split()] for line in path.read_text().splitlines()]
