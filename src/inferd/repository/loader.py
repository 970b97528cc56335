"""Turning a model directory into loadable parts: config, backend, versions, instances.

Blocking work (file reads, ONNX parsing, model loading, warm-up) lives here and runs in
worker threads; the registry (on the event loop) only decides and swaps.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends import BACKENDS, get_backend
from inferd.backends.base import AnyInstance, Backend, LoadContext
from inferd.backends.python.pb_utils.host import HostProvider
from inferd.config.model_config import (
    PLATFORM_TO_BACKEND,
    ConfigError,
    backend_name,
    check_honoured,
    config_needed,
    read_config,
    validate,
)
from inferd.config.model_paths import check_config_paths
from inferd.config.ragged_config import read_ragged_plan
from inferd.errors import InferdError
from inferd.pipelines.ensemble_config import is_ensemble
from inferd.repository.ensemble_load import prepare_ensemble
from inferd.repository.spec import ModelSpec, parse_spec

# Which backend serves a model that has no config naming one (Triton's platform detection).
MODEL_FILES = {
    "model.onnx": "onnxruntime",
    "model.py": "python",
    "model.pt": "pytorch",
    "model.pt2": "pytorch",
}


def list_versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def select_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """Apply the config's version_policy (Triton's default: the latest one)."""
    policy = config.version_policy
    if policy.HasField("all"):
        return available
    if policy.HasField("specific"):
        wanted = {int(v) for v in policy.specific.versions}
        return [v for v in available if v in wanted]
    num = policy.latest.num_versions if policy.HasField("latest") else 1
    return available[-num:]


def parse_config_override(name: str, text: str) -> mc.ModelConfig:
    """A config given with a load request (Triton's `config` parameter: JSON)."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{name}: the 'config' parameter is not a valid model config: {exc}"
        ) from None
    if not config.name:
        config.name = name
    return config


def prepare(
    model_dir: Path, override: mc.ModelConfig | None = None
) -> tuple[mc.ModelConfig, Backend, list[int], ModelSpec]:
    """Read, complete and check a model's config, parse its spec; choose its versions.
    Runs in a thread."""
    if override is not None:
        config = mc.ModelConfig()
        config.CopyFrom(override)
        has_config = True
    else:
        config, has_config = read_config(model_dir)
    available = list_versions(model_dir)
    if not available:
        raise ConfigError(
            f"{model_dir.name}: no numeric version directory (e.g. {model_dir.name}/1/)"
        )
    if is_ensemble(config):  # no files, no backend: its steps' models have them
        return prepare_ensemble(config, model_dir, select_versions(config, available))
    name = backend_name(config)
    if not name and not config.platform:
        # No config (or one without platform/backend): infer the backend from the file.
        newest = model_dir / str(available[-1])
        file_name = next((f for f in MODEL_FILES if (newest / f).exists()), "")
        name = MODEL_FILES.get(file_name, "")
        if not name:
            raise ConfigError(
                f"{model_dir.name}/config.pbtxt: platform/backend: not set, and "
                f"{model_dir.name}/{available[-1]}/ holds no {' or '.join(MODEL_FILES)}"
            )
        if not has_config and name in NEEDS_DECLARED_TENSORS:
            raise ConfigError(
                config_needed(
                    model_dir.name, NEEDS_DECLARED_TENSORS[name], f"{available[-1]}/{file_name}"
                )
            )
        if name == "onnxruntime":
            config.platform = "onnxruntime_onnx"
        elif name == "pytorch":
            config.platform = "pytorch_libtorch"
        else:
            config.backend = name
    elif not name:
        raise ConfigError(
            f"{model_dir.name}/config.pbtxt: platform '{config.platform}' is not supported; "
            f"supported platforms: {', '.join(PLATFORM_TO_BACKEND)} (or set backend: one of "
            f"{', '.join(BACKENDS)})"
        )
    try:
        backend = get_backend(name)
    except InferdError as exc:
        raise ConfigError(f"{model_dir.name}/config.pbtxt: backend: {exc.message}") from None
    # Before completion too: completing the scheduler would silently replace a refused
    # sequence_batching (they share a oneof).
    check_honoured(config, f"{model_dir.name}/config.pbtxt")
    versions = select_versions(config, available)
    if not versions:
        raise ConfigError(
            f"{model_dir.name}/config.pbtxt: version_policy selects none of the versions "
            f"{available}"
        )
    _check_default_model_filename(config, backend, model_dir, versions)
    newest_dir = model_dir / str(versions[-1])
    found = model_file(backend, newest_dir)
    if found is not None:
        try:
            backend.complete_config(config, newest_dir)
        except ConfigError:
            raise
        except Exception as exc:
            # Library messages often quote the absolute path: keep it out of what clients see.
            detail = str(exc).replace(str(found), found.name)
            raise ConfigError(
                f"{model_dir.name}/{versions[-1]}/{found.name}: cannot read: {detail}"
            ) from None
    if not config.instance_group:
        # Triton's completion: one instance; CPU, since no GPU kind was asked for.
        group = config.instance_group.add()
        group.count = 1
        group.kind = mc.ModelInstanceGroup.KIND_CPU
    validate(config, model_dir)
    read_ragged_plan(config)  # its checks; the model's signature keeps the plan
    check_config_paths(config, model_dir)
    return config, backend, versions, parse_spec(config, model_dir)


# Backends whose model files do not record their tensors, so a config must declare them;
# each with the line of config.pbtxt that names it. (A Python model may also complete its
# config from model.py, Triton's auto_complete_config: its backend decides.)
NEEDS_DECLARED_TENSORS = {"pytorch": 'platform: "pytorch_libtorch"'}


def _check_default_model_filename(
    config: mc.ModelConfig, backend: Backend, model_dir: Path, versions: list[int]
) -> None:
    """Triton's `default_model_filename` is accepted where it names the one file inferd
    loads anyway: inferd loads its backends' fixed names, so any other name would be ignored."""
    wanted = config.default_model_filename
    if not wanted:
        return
    where = f"{model_dir.name}/config.pbtxt: default_model_filename"
    names = " or ".join(backend.model_files)
    if wanted not in backend.model_files:
        raise ConfigError(f"{where}: '{wanted}' is not supported; this backend loads {names}")
    for v in versions:
        present = [f for f in backend.model_files if (model_dir / str(v) / f).exists()]
        if present and present != [wanted]:
            raise ConfigError(
                f"{where}: '{wanted}', but {model_dir.name}/{v}/ holds {', '.join(present)}; "
                "keep only the named file"
            )


def model_file(backend: Backend, version_dir: Path) -> Path | None:
    return next((version_dir / f for f in backend.model_files if (version_dir / f).exists()), None)


_LOADS = itertools.count(1)  # LoadContext.load: one number per call below


def load_instances(
    backend: Backend,
    name: str,
    version: str,
    config: mc.ModelConfig,
    version_dir: Path,
    spec: ModelSpec,
    host: HostProvider | None = None,
) -> list[AnyInstance]:
    instances: list[AnyInstance] = []
    count = spec.instance_count
    load = next(_LOADS)
    try:
        for index in range(count):
            ctx = LoadContext(
                name, version, version_dir, config, index, count, host, spec.backend, load
            )
            instances.append(backend.load(ctx))
    except BaseException:
        for inst in instances:
            inst.close()
        raise
    return instances
