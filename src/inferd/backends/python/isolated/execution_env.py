"""A Python model's own environment: Triton's `EXECUTION_ENV_PATH`.

The value names a conda-pack archive (`.tar.gz`, `.tgz` or `.tar`, as Triton takes it) or,
inferd's simpler form, a virtual environment's directory; `$$TRITON_MODEL_DIRECTORY` is the
model's folder and a relative path is read from there. The model's worker process runs that
environment's interpreter, with the environment's packages first on its path and inferd's
(the model API, and what inferd itself imports: numpy, protobuf) after them. So the
environment must be of the server's Python version (major.minor), checked at load.

An archive is unpacked once per archive file (its path, size and modification time) into a
folder of the system's temporary directory, and conda-pack's `bin/conda-unpack` run there.
Each error names the parameter, the path and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.backend_parameters import execution_env_path
from inferd.config.model_config import ConfigError

MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_PROBE = "import json, sys; print(json.dumps([list(sys.version_info[:2]), sys.path]))"
_PROBE_TIMEOUT_S = 60.0
_UNPACK_TIMEOUT_S = 300.0

_lock = threading.Lock()  # one resolution at a time: loads run in threads
_resolved: dict[tuple[str, int, int], ExecutionEnv] = {}


@dataclass(frozen=True, slots=True)
class ExecutionEnv:
    python: str  # the interpreter the worker process runs
    paths: tuple[str, ...]  # the environment's own entries of sys.path, put first


def env_for(config: mc.ModelConfig, version_dir: Path) -> tuple[str, tuple[str, ...]]:
    """(interpreter, paths) for a worker process of the model: its EXECUTION_ENV_PATH's, or
    ("", ()) for the server's own."""
    raw = execution_env_path(config)
    if not raw:
        return "", ()
    field = f"{config.name}/config.pbtxt: parameters.EXECUTION_ENV_PATH"
    env = resolve_env(raw, version_dir.parent, field)
    return env.python, env.paths


def resolve_env(raw: str, model_dir: Path, field: str) -> ExecutionEnv:
    """The environment `raw` names, for the model in `model_dir`; `field` prefixes errors
    (`<model>/config.pbtxt: parameters.EXECUTION_ENV_PATH`)."""
    text = raw.replace(MODEL_DIRECTORY, str(model_dir))
    path = Path(text)
    if not path.is_absolute():
        path = model_dir / path
    shown = raw  # what the config says: never the machine's absolute paths beyond it
    if not path.exists():
        raise ConfigError(f"{field}: '{shown}' does not exist")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _lock:
        known = _resolved.get(key)
        if known is not None:
            return known
        if path.is_dir():
            root = path
        elif path.name.endswith(ARCHIVE_SUFFIXES):
            root = _unpacked(path, key, shown, field)
        else:
            raise ConfigError(
                f"{field}: '{shown}' is neither a directory (a virtual environment) nor a "
                f"conda-pack archive ({', '.join(ARCHIVE_SUFFIXES)})"
            )
        env = _probe(root, shown, field)
        _resolved[key] = env
        return env


def _unpacked(archive: Path, key: tuple[str, int, int], shown: str, field: str) -> Path:
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    home = Path(tempfile.gettempdir()) / "inferd-envs"
    target = home / f"{archive.name.split('.')[0]}-{digest}"
    if (target / ".inferd-unpacked").exists():
        return target
    home.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=home))
    try:
        try:
            with tarfile.open(archive) as tar:
                # `tar`: no absolute names, nothing outside the folder, no set-uid bits; an
                # environment's interpreter may be a link to the base Python, so links stay.
                tar.extractall(work, filter="tar")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ConfigError(f"{field}: '{shown}' cannot be unpacked: {exc}") from None
        unpack = work / "bin" / "conda-unpack"
        if unpack.exists():  # conda-pack's fix of the prefixes recorded in the environment
            done = subprocess.run(
                [str(unpack)], capture_output=True, text=True, timeout=_UNPACK_TIMEOUT_S
            )
            if done.returncode:
                raise ConfigError(
                    f"{field}: '{shown}': bin/conda-unpack failed: {_tail(done.stderr)}"
                )
        (work / ".inferd-unpacked").touch()
        try:
            work.rename(target)
        except OSError:  # another server unpacked it meanwhile: use theirs
            if not (target / ".inferd-unpacked").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _probe(root: Path, shown: str, field: str) -> ExecutionEnv:
    names = ("python3", "python")
    python = next((root / "bin" / n for n in names if (root / "bin" / n).exists()), None)
    if python is None:
        raise ConfigError(
            f"{field}: '{shown}' holds no bin/python3 or bin/python (a virtual environment, "
            "or a conda environment packed with conda-pack)"
        )
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{field}: '{shown}': bin/{python.name} does not run: {exc}") from None
    if done.returncode:
        raise ConfigError(
            f"{field}: '{shown}': bin/{python.name} does not run: {_tail(done.stderr)}"
        )
    (major, minor), path = json.loads(done.stdout)
    ours = sys.version_info[:2]
    if (major, minor) != ours:
        raise ConfigError(
            f"{field}: '{shown}' is Python {major}.{minor}; inferd runs on "
            f"{ours[0]}.{ours[1]}, and the model's process imports inferd's own packages: "
            f"make the environment with Python {ours[0]}.{ours[1]}"
        )
    server = set(sys.path)
    own = tuple(p for p in path if p and p not in server and os.path.isdir(p))
    return ExecutionEnv(str(python), own)


def _tail(text: str, lines: int = 3) -> str:
    return " ".join(text.strip().splitlines()[-lines:]) or "(no output)"
