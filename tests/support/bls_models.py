"""The BLS tests' models (tests/integration/backends/test_bls.py): Python models that call other
models
from their `execute` / `predict`, each written once and served in-process and with
`isolation: "process"` (`<name>_inproc`, `<name>_process`).

Callers take `IN` (FP32 [1]) and answer `OUT` (FP32 [1]) and `MSG` (BYTES [1]): what the
call gave, or, when it failed, OUT = -1 and MSG = "<TritonError code> <message>" (the model
read the error and went on). The called models: `double` (OUT = 2 * IN), `broken` (its
load fails: UNAVAILABLE), `repeat`
(decoupled: IN responses OUT = 1..IN, then the final flag alone) and `target` (records what
it executed, held by a gate file: tests.support.admission_models.gate_closed).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.fault_models import RECORDING_PY, param, write_model

ISOLATIONS = ("inproc", "process")

CALLER_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "MSG", data_type: TYPE_STRING, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{extra}
"""

# What every Triton caller shares: read its request, answer OUT and MSG.
_TRITON_COMMON = """
import asyncio, json
import numpy as np
import triton_python_backend_utils as pb_utils


def answer(value, message=""):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("OUT", np.array([[value]], np.float32)),
        pb_utils.Tensor("MSG", np.array([[message.encode()]], object)),
    ])


def failed(response):
    error = response.error()
    return answer(-1, f"{error.code()} {error.message()}")


def value_of(request):
    return float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().ravel()[0])


def call(model, value, name="IN", timeout=0, dtype=np.float32, parameters=None):
    return pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor(name, np.array([[value]], dtype))],
        timeout=timeout,
        parameters=parameters or {},
    )
"""

# exec(): parameters choose the target, a wrong input name or dtype, a timeout (µs).
RELAY_PY = (
    _TRITON_COMMON
    + """

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.target = config["parameters"].get("target", {}).get("string_value", "double")

    def execute(self, requests):
        responses = []
        for request in requests:
            p = json.loads(request.parameters())
            x = value_of(request)
            bls = call(
                p.get("target", self.target),
                x,
                name=p.get("input", "IN"),
                timeout=int(p.get("timeout_us", 0)),
                dtype=np.float64 if p.get("fp64") else np.float32,
            )
            response = bls.exec()
            if response.has_error():
                responses.append(failed(response))
                continue
            out = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
            responses.append(answer(float(out.ravel()[0]) + 1, "ok"))
        return responses
"""
)

# async_exec(): three calls at once, gathered; OUT their sum.
FANOUT_PY = (
    _TRITON_COMMON
    + """

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = value_of(request)
            got = await asyncio.gather(*[call("double", x + i).async_exec() for i in range(3)])
            for response in got:
                if response.has_error():
                    responses.append(failed(response))
                    break
            else:
                total = sum(float(r.output_tensors()[0].as_numpy().ravel()[0]) for r in got)
                responses.append(answer(total, f"{len(got)} calls"))
        return responses
"""
)

# exec(decoupled=True): OUT the sum of `repeat`'s responses; MSG how many came and whether
# the last was empty (the final flag alone, as in Triton). Parameter `take`: stop reading
# after that many.
STREAMSUM_PY = (
    _TRITON_COMMON
    + """

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            bls = pb_utils.InferenceRequest(
                model_name="repeat",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([value_of(request)], np.float32))],
            )
            take = int(json.loads(request.parameters()).get("take", 0))
            total, count, last_empty, error = 0.0, 0, False, None
            for response in bls.exec(decoupled=True):
                if response.has_error():
                    error = response
                    break
                if take and count == take:  # dropping the iterator ends the call
                    break
                count += 1
                last_empty = len(response.output_tensors()) == 0
                if not last_empty:
                    total += float(response.output_tensors()[0].as_numpy().ravel()[0])
            if error is not None:
                responses.append(failed(error))
            else:
                responses.append(answer(total, f"{count} responses, last empty: {last_empty}"))
        return responses
"""
)

# Calls itself (one instance) when IN > 0: the inner call can only run once the outer one
# is done; the caller's deadline ends the wait.
SELFCALL_PY = (
    _TRITON_COMMON
    + """

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = value_of(request)
            if x <= 0:
                responses.append(answer(x, "inner"))
                continue
            response = call(self.name, 0.0).exec()
            responses.append(failed(response) if response.has_error() else answer(x, "outer"))
        return responses
"""
)

# inferd's own API: context.infer (IN >= 0) or, for IN < 0, a call to a missing model whose
# ModelCallError the model reads.
ICALL_PY = """
import numpy as np
from inferd import ModelCallError

class Model:
    def load(self, context):
        self.context = context

    def predict(self, inputs):
        x = inputs["IN"]
        target = "double" if (x >= 0).all() else "no_such_model"
        try:
            out = self.context.infer(target, {"IN": x}, ["OUT"])["OUT"]
        except ModelCallError as exc:
            return {"OUT": np.array([[-1.0]], np.float32),
                    "MSG": np.array([[f"{exc.status} {exc.message}".encode()]], object)}
        return {"OUT": out + 1, "MSG": np.array([[b"ok"]], object)}
"""

# inferd's own API, async: three infer_async calls gathered; and a stream from `repeat`.
IACALL_PY = """
import asyncio
import numpy as np

class Model:
    def load(self, context):
        self.context = context

    async def predict(self, inputs):
        x = inputs["IN"]
        got = await asyncio.gather(
            *[self.context.infer_async("double", {"IN": x + i}) for i in range(3)])
        streamed = list(self.context.infer_stream("repeat", {"IN": x.reshape(1)}))
        total = sum(float(g["OUT"].ravel()[0]) for g in got)
        return {"OUT": np.array([[total]], np.float32),
                "MSG": np.array([[f"{len(streamed)} streamed".encode()]], object)}
"""

BROKEN_PY = """
class Model:
    def load(self, context):
        raise RuntimeError("this model never loads")
"""

DOUBLE_PY = """
import numpy as np

class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"] * 2}
"""

REPEAT_PY = """
import numpy as np

class Model:
    def predict_stream(self, inputs, responses):
        n = int(inputs["IN"].ravel()[0])
        for i in range(1, n + 1):
            responses.send({"OUT": np.array([float(i)], np.float32)})
        responses.close()
"""

REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

CALLERS = {
    "relay": RELAY_PY,
    "fanout": FANOUT_PY,
    "streamsum": STREAMSUM_PY,
    "selfcall": SELFCALL_PY,
    "icall": ICALL_PY,
    "iacall": IACALL_PY,
}
# A relay whose default target is the gated `target` model.
GUARD = "guard"


def _write(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


def write_bls_models(root: Path) -> Path:
    """The repository (root/models); records under root/records, gates under root/gates."""
    repo = root / "models"
    (root / "records").mkdir()
    (root / "gates").mkdir()
    for caller, code in CALLERS.items():
        for iso in ISOLATIONS:
            name = f"{caller}_{iso}"
            extra = param("isolation", "process") if iso == "process" else ""
            _write(repo, name, CALLER_CONFIG.format(name=name, extra=extra), code)
    for iso in ISOLATIONS:
        guard = f"{GUARD}_{iso}"
        extra = (param("isolation", "process") if iso == "process" else "") + param(
            "target", "target"
        )
        _write(repo, guard, CALLER_CONFIG.format(name=guard, extra=extra), RELAY_PY)
    write_model(repo, "double", DOUBLE_PY, max_batch_size=8)
    write_model(repo, "broken", BROKEN_PY)  # UNAVAILABLE: its load raises
    (repo / "repeat" / "1").mkdir(parents=True)
    (repo / "repeat" / "config.pbtxt").write_text(REPEAT_CONFIG)
    (repo / "repeat" / "1" / "model.py").write_text(REPEAT_PY)
    write_model(
        repo,
        "target",
        RECORDING_PY,
        param("record_path", root / "records" / "target")
        + param("gate_path", root / "gates" / "target")
        + "instance_group [ { count: 1, kind: KIND_CPU } ]\n",
    )
    return repo
