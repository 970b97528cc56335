"""The API a Python model implements, at the import path models and docs have used since
the start: `from inferd.python_model import PythonModel` keeps working. The API itself lives
in `inferd.backends.python.model_api`; the usual import is `from inferd import PythonModel`."""

from __future__ import annotations

from inferd.backends.python.model_api import (
    ModelCallError,
    ModelContext,
    PythonModel,
    RequestInfo,
    ResponseSender,
)
from inferd.types import SEQUENCE_END, SEQUENCE_START

__all__ = [
    "SEQUENCE_END",
    "SEQUENCE_START",
    "ModelCallError",
    "ModelContext",
    "PythonModel",
    "RequestInfo",
    "ResponseSender",
]
