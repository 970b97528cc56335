"""The model registry: scans the repository, loads each model version, tracks its state.

A model whose config is broken, or a version that fails to load, is marked UNAVAILABLE with
the reason; every other model still loads and serves.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends import get_backend
from inferd.backends.base import AnyInstance, Backend, LoadContext
from inferd.errors import InferdError, not_found, unavailable
from inferd.events import Telemetry
from inferd.repository.config import (
    ConfigError,
    backend_name,
    instance_count,
    parameter,
    read_config,
    validate,
)
from inferd.scheduling.batcher import BatchingOptions, DynamicBatcher
from inferd.signature import ModelSignature

log = logging.getLogger("inferd.repository")

# Which backend serves a model that has no config naming one (Triton's platform detection).
MODEL_FILES = {
    "model.onnx": "onnxruntime",
    "model.py": "python",
    "model.pt": "pytorch",
    "model.pt2": "pytorch",
}


class State(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: str
    config: mc.ModelConfig
    signature: ModelSignature
    state: State = State.LOADING
    reason: str = ""
    batcher: DynamicBatcher | None = None
    devices: list[str] = field(default_factory=list)
    load_duration_s: float = 0.0

    @property
    def is_ready(self) -> bool:
        return self.state is State.READY


@dataclass(eq=False)
class Model:
    name: str
    config: mc.ModelConfig | None = None
    reason: str = ""  # why the model as a whole could not be configured
    versions: dict[str, ModelVersion] = field(default_factory=dict)

    def default_version(self) -> ModelVersion | None:
        """The highest-numbered ready version."""
        ready = [v for v in self.versions.values() if v.is_ready]
        return max(ready, key=lambda v: int(v.version)) if ready else None


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


class ModelRegistry:
    def __init__(self, repository: Path, telemetry: Telemetry | None = None) -> None:
        self.repository = repository
        self.telemetry = telemetry or Telemetry()
        self.models: dict[str, Model] = {}

    # -- lookups on the request path ----------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelVersion:
        model = self.models.get(name)
        if model is None:
            raise not_found(f"unknown model '{name}'")
        if not version:
            mv = model.default_version()
            if mv is None:
                reason = model.reason or _first_reason(model)
                raise unavailable(
                    f"model '{name}' has no ready version" + (f": {reason}" if reason else "")
                )
            return mv
        mv = model.versions.get(version)
        if mv is None:
            raise not_found(f"unknown version '{version}' of model '{name}'")
        if not mv.is_ready:
            raise unavailable(
                f"model '{name}' version {version} is {mv.state.value}"
                + (f": {mv.reason}" if mv.reason else "")
            )
        return mv

    def is_ready(self) -> bool:
        """Strict readiness, as Triton: every model has all its versions READY."""
        return all(
            m.versions and all(v.is_ready for v in m.versions.values())
            for m in self.models.values()
        )

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for name in sorted(self.models):
            model = self.models[name]
            if not model.versions:
                if not ready_only:
                    row = {"name": name, "state": State.UNAVAILABLE.value}
                    if model.reason:
                        row["reason"] = model.reason
                    rows.append(row)
                continue
            for v in sorted(model.versions.values(), key=lambda v: int(v.version)):
                if ready_only and not v.is_ready:
                    continue
                row = {"name": name, "version": v.version, "state": v.state.value}
                if v.reason:
                    row["reason"] = v.reason
                rows.append(row)
        return rows

    # -- lifecycle ----------------------------------------------------------------------

    async def load_all(self) -> None:
        if not self.repository.is_dir():
            raise FileNotFoundError(f"model repository {self.repository} is not a directory")
        dirs = sorted(
            p for p in self.repository.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        await asyncio.gather(*(self._load_model(d) for d in dirs))

    async def _load_model(self, model_dir: Path) -> None:
        model = Model(model_dir.name)
        self.models[model.name] = model
        try:
            config, backend, versions = await asyncio.to_thread(_prepare, model_dir)
        except (ConfigError, InferdError, OSError, RuntimeError, ValueError) as exc:
            model.reason = str(exc)
            log.error("model %s failed: %s", model.name, model.reason)
            return
        model.config = config
        for number in versions:
            mv = ModelVersion(model.name, str(number), config, ModelSignature(config))
            model.versions[mv.version] = mv
        await asyncio.gather(
            *(self._load_version(mv, backend, model_dir) for mv in model.versions.values())
        )

    async def _load_version(self, mv: ModelVersion, backend: Backend, model_dir: Path) -> None:
        version_dir = model_dir / mv.version
        count = instance_count(mv.config)
        started = time.monotonic()
        try:
            if _model_file(backend, version_dir) is None:
                raise RuntimeError(
                    f"{mv.name}/{mv.version}/ holds no {' or '.join(backend.model_files)}"
                )
            instances = await asyncio.to_thread(_load_instances, backend, mv, version_dir, count)
        except Exception as exc:
            mv.state = State.UNAVAILABLE
            mv.reason = f"load failed: {exc}"
            log.error("model %s version %s failed to load: %s", mv.name, mv.version, exc)
            return
        mv.batcher = DynamicBatcher(
            mv.name, instances, batching_options(mv.config), mv.version, self.telemetry
        )
        mv.devices = [inst.device for inst in instances]
        mv.load_duration_s = time.monotonic() - started
        mv.state = State.READY
        log.info(
            "loaded model %s version %s (%s, %d instance%s on %s, max_batch_size %d, "
            "batching %s) in %.2fs",
            mv.name,
            mv.version,
            backend_name(mv.config),
            count,
            "" if count == 1 else "s",
            ",".join(sorted(set(mv.devices))),
            mv.config.max_batch_size,
            batching_options(mv.config).policy if mv.config.max_batch_size else "off",
            mv.load_duration_s,
        )

    async def unload_all(self) -> None:
        versions = [v for m in self.models.values() for v in m.versions.values()]
        for mv in versions:
            if mv.is_ready:
                mv.state = State.UNLOADING
        await asyncio.gather(*(v.batcher.stop() for v in versions if v.batcher is not None))
        for mv in versions:
            mv.state = State.UNAVAILABLE
            mv.reason = "unloaded"


def _first_reason(model: Model) -> str:
    return next((v.reason for v in model.versions.values() if v.reason), "")


def batching_options(config: mc.ModelConfig) -> BatchingOptions:
    db = config.dynamic_batching
    return BatchingOptions(
        max_batch_size=int(config.max_batch_size),
        preferred_sizes=tuple(int(s) for s in db.preferred_batch_size),
        max_delay_s=db.max_queue_delay_microseconds / 1e6,
        policy=parameter(config, "batching_policy", "work_conserving"),
    )


def _prepare(model_dir: Path) -> tuple[mc.ModelConfig, Backend, list[int]]:
    """Read, complete and check a model's config; choose its versions. Runs in a thread."""
    config, _ = read_config(model_dir)
    available = list_versions(model_dir)
    if not available:
        raise ConfigError(
            f"{model_dir.name}: no numeric version directory (e.g. {model_dir.name}/1/)"
        )
    name = backend_name(config)
    if not name and not config.platform:
        # No config (or one without platform/backend): infer the backend from the file.
        newest = model_dir / str(available[-1])
        name = next((b for f, b in MODEL_FILES.items() if (newest / f).exists()), "")
        if not name:
            raise ConfigError(
                f"{model_dir.name}/config.pbtxt: platform/backend: not set, and "
                f"{model_dir.name}/{available[-1]}/ holds no {' or '.join(MODEL_FILES)}"
            )
        if name == "onnxruntime":
            config.platform = "onnxruntime_onnx"
        elif name == "pytorch":
            config.platform = "pytorch_libtorch"
        else:
            config.backend = name
    elif not name:
        raise ConfigError(
            f"{model_dir.name}/config.pbtxt: platform '{config.platform}' is not supported"
        )
    try:
        backend = get_backend(name)
    except InferdError as exc:
        raise ConfigError(f"{model_dir.name}/config.pbtxt: backend: {exc.message}") from None
    versions = select_versions(config, available)
    if not versions:
        raise ConfigError(
            f"{model_dir.name}/config.pbtxt: version_policy selects none of the versions "
            f"{available}"
        )
    newest_dir = model_dir / str(versions[-1])
    model_file = _model_file(backend, newest_dir)
    if model_file is not None:
        try:
            backend.complete_config(config, newest_dir)
        except ConfigError:
            raise
        except Exception as exc:
            # Library messages often quote the absolute path: keep it out of what clients see.
            detail = str(exc).replace(str(model_file), model_file.name)
            raise ConfigError(
                f"{model_dir.name}/{versions[-1]}/{model_file.name}: cannot read: {detail}"
            ) from None
    if not config.instance_group:
        # Triton's completion: one instance; CPU, since no GPU kind was asked for.
        group = config.instance_group.add()
        group.count = 1
        group.kind = mc.ModelInstanceGroup.KIND_CPU
    validate(config, model_dir)
    return config, backend, versions


def _model_file(backend: Backend, version_dir: Path) -> Path | None:
    return next((version_dir / f for f in backend.model_files if (version_dir / f).exists()), None)


def _load_instances(
    backend: Backend, mv: ModelVersion, version_dir: Path, count: int
) -> list[AnyInstance]:
    instances: list[AnyInstance] = []
    try:
        for index in range(count):
            ctx = LoadContext(mv.name, mv.version, version_dir, mv.config, index, count)
            instances.append(backend.load(ctx))
    except BaseException:
        for inst in instances:
            inst.close()
        raise
    return instances
