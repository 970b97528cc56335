"""Importing a Python model's `<version>/model.py`, fresh each time, as Triton's stub does.

`triton_python_backend_utils` is made importable first (inferd's `pb_utils`), so that models
written for Triton's Python backend import unchanged. As in Triton, the version folder and
the model folder are on `sys.path` while model.py runs, so it can import modules it ships
beside it (`from helpers import ...`); in the server process only for the import itself,
since other models share that `sys.path` (a worker process keeps them, as Triton's stub).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from inferd.backends.import_lock import IMPORT_LOCK
from inferd.backends.python import pb_utils
from inferd.backends.python.model_prints import running_model

MODEL_FILE = "model.py"
_module_ids = itertools.count()
_path_lock = threading.Lock()  # one import at a time changes sys.path


@contextlib.contextmanager
def _on_sys_path(version_dir: Path, keep: bool) -> Iterator[None]:
    added = [str(d) for d in (version_dir, version_dir.parent) if str(d) not in sys.path]
    with _path_lock:
        sys.path.extend(added)
        try:
            yield
        finally:
            if not keep:
                for entry in added:
                    with contextlib.suppress(ValueError):
                        sys.path.remove(entry)


def import_model_module(
    model_name: str, version_dir: Path, keep_on_path: bool = False
) -> ModuleType:
    """Execute `<version_dir>/model.py` as a fresh module, its prints going to the model's
    log; `keep_on_path`: leave its folders on sys.path (a worker process of its own)."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    path = version_dir / MODEL_FILE
    module_name = f"inferd_model_{next(_module_ids)}_{model_name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {model_name}/{version_dir.name}/{MODEL_FILE}")
    module = importlib.util.module_from_spec(spec)
    # Registered so that pickling and dataclasses inside the model module work.
    sys.modules[module_name] = module
    try:
        # IMPORT_LOCK: what model.py imports must not race another model's imports
        with IMPORT_LOCK, running_model(model_name), _on_sys_path(version_dir, keep_on_path):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def may_define_triton_model(version_dir: Path) -> bool:
    """Whether model.py can define a `TritonPythonModel` (and so `auto_complete_config`):
    a file that never names it cannot, and need not be run to find out (which, with
    `isolation: "process"`, would cost a worker process)."""
    try:
        return "TritonPythonModel" in (version_dir / MODEL_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return True  # let the import report it
