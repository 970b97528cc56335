"""inferd: a model inference server speaking the KServe v2 / Triton protocol."""

from __future__ import annotations

__version__ = "0.1.0"

from inferd.backends.python.model_api import (  # noqa: E402
    ModelCallError,
    ModelContext,
    PythonModel,
    RequestInfo,
    ResponseSender,
)
from inferd.backends.python.shared_arrays import SharedArrayError, shared_array  # noqa: E402
from inferd.types import SEQUENCE_END, SEQUENCE_START  # noqa: E402

__all__ = [
    "SEQUENCE_END",
    "SEQUENCE_START",
    "ModelCallError",
    "ModelContext",
    "PythonModel",
    "RequestInfo",
    "ResponseSender",
    "SharedArrayError",
    "__version__",
    "shared_array",
]
