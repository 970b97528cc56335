"""Backends turn a model version on disk into instances that execute batches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferd.backends.import_lock import IMPORT_LOCK
from inferd.errors import invalid

if TYPE_CHECKING:  # `import inferd` (the Python model API lives below) stays light
    from inferd.backends.base import Backend

BACKENDS = ("onnxruntime", "pytorch", "python")  # what `backend:` may name


def get_backend(name: str) -> Backend:
    with IMPORT_LOCK:  # backend modules import torch or onnxruntime: one import at a time
        return _backend(name)


def _backend(name: str) -> Backend:
    # Imported lazily so that a backend's heavy dependency loads only when a model needs it.
    if name == "onnxruntime":
        from inferd.backends.onnx import OnnxBackend

        return OnnxBackend()
    if name == "pytorch":
        try:
            from inferd.backends.torch import TorchBackend
        except ImportError:
            raise invalid("backend 'pytorch' needs torch: pip install 'inferd[torch]'") from None

        return TorchBackend()
    if name == "python":
        from inferd.backends.python.python_backend import PythonBackend

        return PythonBackend()
    raise invalid(f"unknown backend '{name}'; supported backends: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "get_backend"]
