"""The warm-up tests' Python models: ones that count warm-up calls, fail it, or answer
outputs their config does not declare; and a repository's index row."""

from __future__ import annotations

from typing import Any

from tests.support.lifecycle_models import WARM_COUNTING_PY
from tests.support.protocol_clients import Client

POISONED_PY = WARM_COUNTING_PY.replace("return False", "return True")  # raises on zeros


ZERO_WARMUP = """
model_warmup [ {
  name: "zeros"
  batch_size: 1
  inputs { key: "IN" value: { data_type: TYPE_FP32, dims: [ 1 ], zero_data: true } }
} ]
"""


NO_AUTO_WARMUP = 'parameters { key: "auto_warmup" value: { string_value: "false" } }'


MISNAMED_PY = """
class Model:
    def predict(self, inputs):
        return {"out": inputs["IN"]}
"""


# Models whose answers contradict their config (IN, OUT: FP32 dims [1], max_batch_size 8),
# with what the reason must say besides the output's name and config.pbtxt.
NONCONFORMING = {
    "misnamed": (MISNAMED_PY, ["produced no output 'OUT'", "'out'"]),
    "stringly": (
        """
import numpy as np

class Model:
    def predict(self, inputs):
        return {"OUT": np.array([["one"]] * len(inputs["IN"]))}
""",
        ["output 'OUT' is <U3", "does not convert to the FP32"],
    ),
    "misshapen": (
        """
import numpy as np

class Model:
    def predict(self, inputs):
        return {"OUT": np.zeros((len(inputs["IN"]), 3), np.float32)}
""",
        ["output 'OUT' has shape [1, 3]", "[-1, 1]"],
    ),
    "triton_misbatched": (
        """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            doubled = pb_utils.Tensor("OUT", np.concatenate([x, x]))
            answers.append(pb_utils.InferenceResponse([doubled]))
        return answers
""",
        ["output 'OUT' has shape [2, 1]", "batch size 1"],
    ),
}


def index_row(client: Client, model: str) -> dict[str, Any]:
    """The model's row of the repository index, as tritonclient reads it."""
    if client.protocol == "http":
        rows = client.raw.get_model_repository_index()
    else:
        rows = client.raw.get_model_repository_index(as_json=True)["models"]
    (row,) = [r for r in rows if r["name"] == model]
    return dict(row)
