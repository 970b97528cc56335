"""Backends turn a model version on disk into instances that execute batches."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from inferd.errors import invalid

if TYPE_CHECKING:  # `import inferd` (the Python model API lives below) stays light
    from inferd.backends.base import Backend

BACKENDS = ("onnxruntime", "pytorch", "python")  # what `backend:` may name

# Models load concurrently, each in a thread. Two threads importing torch (or onnxruntime)
# at once can see a half-initialised package: `KeyError: 'torch.version'` was seen at start
# with the example repository. One import at a time; after the first, a dict lookup.
_import_lock = threading.Lock()


def get_backend(name: str) -> Backend:
    with _import_lock:
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
