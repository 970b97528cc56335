"""A model and its versions as the registry keeps them: their states, and why one is not
serving (what the index and the errors of the request path report)."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tritonclient.grpc import model_config_pb2 as mc

from inferd.cache.model_cache_spec import CacheOptions
from inferd.reliability.circuit import CircuitBreaker
from inferd.reliability.routing import Router
from inferd.repository.checksum import Fingerprint
from inferd.repository.spec import ModelSpec
from inferd.scheduling.scheduler import Scheduler
from inferd.scheduling.sequence.sequence_config import SequenceOptions
from inferd.tensors.signature import ModelSignature

if TYPE_CHECKING:
    from inferd.monitoring.drift_sampler import DriftMonitor
    from inferd.pipelines.ensemble import Ensemble
    from inferd.reliability.degrade.controller import Degradation


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
    spec: ModelSpec  # the config parsed at load: read its fields, not the config's strings
    state: State = State.LOADING
    reason: str = ""  # why it is not serving, or why the latest attempt to replace it failed
    warning: str = ""  # a problem that does not stop it serving (a failed automatic warm-up)
    batcher: Scheduler | None = None
    sequence: SequenceOptions | None = None  # a sequence model's sequence_batching
    devices: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    checksum: str = ""  # of the version directory's files
    execution_timeout_s: float = 0.0  # 0: none (docs/reliability.md)
    load_duration_s: float = 0.0
    # An ensemble's runner (also its `batcher`); None for a model with instances.
    ensemble: Ensemble | None = None
    # An ensemble UNAVAILABLE only until a composing model is ready: the reason. It neither
    # fails its load nor holds the server's readiness down (the composing model does).
    waits_for: str = ""
    warmup_duration_s: float = 0.0
    drift: DriftMonitor | None = None  # its drift monitor (docs/monitoring.md)
    # Set when both the config enables the response cache and the server has one: the one
    # attribute the request path checks (docs/cache.md).
    cache: CacheOptions | None = None
    # The version as the cache keys it: its number and what it was loaded from (its files'
    # and config's checksums), so a version reloaded from new files never meets the old
    # files' answers, in this process's tier or in a Redis shared with other replicas.
    cache_version: str = ""
    # model_transaction_policy { decoupled: true }: answers through a response stream.
    decoupled: bool = field(init=False)

    def __post_init__(self) -> None:
        self.decoupled = bool(self.config.model_transaction_policy.decoupled)

    @property
    def is_ready(self) -> bool:
        return self.state is State.READY


@dataclass(eq=False)
class Model:
    name: str
    config: mc.ModelConfig | None = None
    reason: str = ""  # why the model (or its last reload) could not be configured
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    router: Router = field(default_factory=Router)
    circuit: CircuitBreaker = field(default_factory=lambda: CircuitBreaker(""))
    # Its degradation tiers in motion (docs/reliability.md#degradation-tiers); None: none.
    degrade: Degradation | None = None
    config_checksum: str = ""
    seen: Fingerprint = ()  # the files' stat fingerprint at the last (re)load
    load_failures: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def default_version(self) -> ModelVersion | None:
        """The highest-numbered ready version."""
        if len(self.versions) == 1:  # the common case, on every request: no list, no max
            (only,) = self.versions.values()
            return only if only.is_ready else None
        ready = [v for v in self.versions.values() if v.is_ready]
        return max(ready, key=lambda v: int(v.version)) if ready else None


def ready_versions(model: Model) -> set[str]:
    return {v for v, mv in model.versions.items() if mv.is_ready}


def latest_reason(model: Model, mv: ModelVersion) -> str:
    """Why `mv` is not serving, or why the latest attempt to replace it failed. The model's
    own reason (its config failed) is set by the latest attempt and cleared by the next one
    that gets past the config, so it is never older than a version's."""
    return model.reason or mv.reason


def first_reason(model: Model) -> str:
    return next((v.reason for v in model.versions.values() if v.reason), "")
