"""Model loads run in threads, several at once: a backend's import and a Python model's
model.py (which imports what the model needs) run one at a time, under one lock, so no
thread sees a package another is half-way through importing."""

from __future__ import annotations

from pathlib import Path

from inferd.backends import get_backend
from inferd.backends.import_lock import IMPORT_LOCK
from inferd.backends.python.model_import import import_model_module


def test_model_py_runs_under_the_import_lock(tmp_path: Path) -> None:
    version_dir = tmp_path / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text(
        "from inferd.backends.import_lock import IMPORT_LOCK\n"
        "HELD_WHILE_IMPORTING = IMPORT_LOCK.locked()\n"
    )
    module = import_model_module("m", version_dir)
    assert module.HELD_WHILE_IMPORTING is True
    assert not IMPORT_LOCK.locked()  # given back afterwards


def test_a_failing_model_py_gives_the_lock_back(tmp_path: Path) -> None:
    version_dir = tmp_path / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text("import inferd_no_such_package\n")
    try:
        import_model_module("m", version_dir)
    except ModuleNotFoundError as error:
        assert error.name == "inferd_no_such_package"
    else:
        raise AssertionError("the import should have failed")
    assert not IMPORT_LOCK.locked()
    assert get_backend("python") is not None  # the next load is not stuck behind it
