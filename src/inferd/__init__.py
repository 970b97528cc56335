"""inferd: a model inference server speaking the KServe v2 / Triton protocol."""

from __future__ import annotations

__version__ = "0.1.0"

from inferd.python_model import (  # noqa: E402
    SEQUENCE_END,
    SEQUENCE_START,
    ModelCallError,
    ModelContext,
    PythonModel,
    RequestInfo,
    ResponseSender,
)

__all__ = [
    "SEQUENCE_END",
    "SEQUENCE_START",
    "ModelCallError",
    "ModelContext",
    "PythonModel",
    "RequestInfo",
    "ResponseSender",
    "__version__",
]
