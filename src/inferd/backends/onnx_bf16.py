"""BF16 tensors through ONNX Runtime's Python API.

ONNX Runtime runs `tensor(bfloat16)` graphs, but its Python API has no numpy type for
them: `InferenceSession.run` refuses `ml_dtypes.bfloat16` arrays, and `OrtValue.numpy()`
refuses bfloat16 results. Sessions with a BF16 tensor therefore run with OrtValues: BF16
inputs go in as their uint16 bit patterns typed BFLOAT16 (a view, no copy), and BF16
outputs come back as one copy of their bits, viewed as bfloat16 (outputs the session
allocates itself are in host memory, whatever the provider). Sessions without BF16 keep
the plain `run`: nothing changes for them.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
import onnxruntime as ort

from inferd.config.model_config import ConfigError
from inferd.datatypes import BF16
from inferd.types import Array

ONNX_TYPE = "tensor(bfloat16)"
# onnx.TensorProto.BFLOAT16; onnx itself is not a dependency of the server.
_ONNX_BFLOAT16 = 16


def _bits(array: Array) -> Array:
    """A bfloat16 array's elements as their uint16 bit patterns, C-contiguous."""
    return np.ascontiguousarray(array).view(np.uint16)


def _bf16_from(value: Any) -> Array:
    """A copy of a CPU OrtValue holding bfloat16 elements, as an ml_dtypes array."""
    if value.device_name().lower() != "cpu":
        # Never read a device pointer as host memory: fail the request, saying why.
        raise RuntimeError(f"a BF16 output came back on {value.device_name()}, not the CPU")
    shape = tuple(value.shape())
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype=BF16)
    # The only route to the bytes the Python API offers for this type: its data pointer,
    # valid while `value` lives (it does: the copy is made here).
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(raw, dtype=np.uint16).copy().view(BF16).reshape(shape)


class BFloat16Run:
    """`session.run` for a session with at least one BF16 input or output."""

    def __init__(self, session: ort.InferenceSession, where: str) -> None:
        """Raises ConfigError (naming `where`, the model's config) for a model that also
        takes a string input: OrtValues cannot hold strings."""
        self._session = session
        self._bf16_inputs = {i.name for i in session.get_inputs() if i.type == ONNX_TYPE}
        strings = [i.name for i in session.get_inputs() if i.type == "tensor(string)"]
        if strings:
            raise ConfigError(
                f"{where}: input '{strings[0]}' is TYPE_STRING beside BF16 tensors; ONNX "
                "Runtime's Python API cannot feed both to one model"
            )

    def run(self, output_names: list[str], inputs: dict[str, Array]) -> dict[str, Array]:
        feeds = {
            name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(_bits(array), _ONNX_BFLOAT16)
            if name in self._bf16_inputs
            else ort.OrtValue.ortvalue_from_numpy(array)
            for name, array in inputs.items()
        }
        results = self._session.run_with_ort_values(output_names, feeds)
        return {
            name: _bf16_from(value) if value.data_type() == ONNX_TYPE else value.numpy()
            for name, value in zip(output_names, results, strict=True)
        }
