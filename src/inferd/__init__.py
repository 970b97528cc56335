"""inferd: a model inference server speaking the KServe v2 / Triton protocol."""

from __future__ import annotations

__version__ = "0.1.0"

from inferd.python_model import ModelContext, PythonModel, ResponseSender  # noqa: E402

__all__ = ["ModelContext", "PythonModel", "ResponseSender", "__version__"]
