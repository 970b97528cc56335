"""The protocol-neutral core that the HTTP and gRPC adapters both call.

Adapters translate their wire format into `InferRequest` and back; everything else (lookup,
checks, scheduling, output conformance) happens here, once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd import __version__
from inferd.config.model_config import ConfigError, with_kinds_used
from inferd.dataplane import drift_api
from inferd.dataplane.access import AccessPolicy
from inferd.dataplane.decoupled import StreamingSteps
from inferd.dataplane.shm_regions import CUDA_UNSUPPORTED, SharedMemoryRegistry
from inferd.dataplane.unary import InferenceSteps
from inferd.errors import ErrorKind, InferdError, invalid, not_found
from inferd.events import Telemetry
from inferd.monitoring.capture import Capture
from inferd.reliability.degrade.controller import degradation_statistics
from inferd.repository import uploads
from inferd.repository.loader import parse_config_override
from inferd.repository.model_state import ModelVersion
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.runtime_settings import RuntimeSettings
from inferd.telemetry.statistics import StatisticsSink
from inferd.tensors.signature import TensorSpec
from inferd.workers import peers
from inferd.workers.statistics import provider_for

EXTENSIONS = [
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "sequence",
    "statistics",
    "system_shared_memory",
    "trace",
    "logging",
]


class DataPlane(InferenceSteps, StreamingSteps):
    """Inference (`start`, `admit`, `infer`, `respond`: unary.py; `start_stream`,
    `admit_stream`, `stream`: decoupled.py) and every other API, protocol-neutral."""

    def __init__(
        self,
        registry: ModelRegistry,
        telemetry: Telemetry,
        admin_api: bool = False,
        access: AccessPolicy | None = None,
        model_upload: str = "off",
    ) -> None:
        self.registry = registry
        self.admin_api = admin_api
        # Who may call which API group: the adapters consult it with each call's headers.
        self.access = access or AccessPolicy()
        self.model_upload = model_upload  # load's `file:` parameters: off, files or code
        self.telemetry = telemetry
        self.statistics = StatisticsSink()
        telemetry.add(self.statistics)
        self.is_shutting_down = False
        self.max_inflight = 0  # server-wide limit of requests in flight (0: none)
        self.max_response_bytes = 0  # responses past it fail with PAYLOAD_TOO_LARGE (0: none)
        self.workers = None  # a WorkerSlot, set in a worker of `--workers N`
        # The engine's model table of `--workers N --engine` (engine/model_table.py): whose
        # front ends' signature checks a request may carry; None in one process.
        self.checked_signatures = None
        self._inflight = 0
        self.response_cache = None  # set by the server with --cache-config (docs/cache.md)
        self.shared_memory = SharedMemoryRegistry()
        # Sampled requests: written by --capture-dir's writer, joined to feedback labels.
        self.capture = Capture(registry)
        # The trace and log settings APIs, changed through the same gate as the repository.
        self.runtime = RuntimeSettings(self._admin, lambda name: name in self.registry.models)

    # -- health and metadata ------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready means able to serve: not draining, every model has a version that loaded,
        whose circuit is closed, whose workers are alive, that has an instance not stuck
        past its execution timeout and that isn't failing every execution. Not merely "the
        process is up"."""
        if self.is_shutting_down or not self.registry.is_ready():
            return False
        for model in self.registry.models.values():
            mv = model.default_version()
            if mv is not None and self.health_problem(model.name, mv):
                return False
        return True

    def health_problem(self, name: str, mv: ModelVersion) -> str:
        """Why a loaded version cannot be trusted to serve now, or ""."""
        model = self.registry.models[name]
        if model.circuit.held:
            return f"its circuit is held open by {model.circuit.held}"
        if model.circuit.is_open:
            return "its circuit breaker is open"
        batcher = mv.batcher
        if batcher is None:
            return "it is not loaded"
        if not batcher.instances_alive():
            return "an instance is down (its worker process died, or its is_ready() said no)"
        if not batcher.serving_instances():
            return "every instance is stuck in an execution past its execution timeout"
        limit = mv.spec.unready_after_failures
        if limit and batcher.consecutive_failures >= limit:
            return f"its last {batcher.consecutive_failures} executions failed"
        return ""

    def server_metadata(self) -> dict[str, Any]:
        extensions = EXTENSIONS
        if self.workers is not None:  # see _shared_memory_gate
            extensions = [e for e in EXTENSIONS if e != "system_shared_memory"]
        return {"name": "inferd", "version": __version__, "extensions": extensions}

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            mv = self.registry.get(name, version)
        except InferdError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                raise
            return False
        return not self.is_shutting_down and not self.health_problem(name, mv)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        mv = self.registry.get(name, version)
        sig = mv.signature
        model = self.registry.models[name]
        versions = (
            [version]
            if version
            else sorted((v.version for v in model.versions.values() if v.is_ready), key=int)
        )
        return {
            "name": name,
            "versions": versions,
            "platform": mv.config.platform or mv.config.backend,
            "inputs": [_tensor_meta(s, sig.metadata_shape(s)) for s in sig.inputs.values()],
            "outputs": [_tensor_meta(s, sig.metadata_shape(s)) for s in sig.outputs.values()],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        """The served version's config, with its files' checksum as parameter
        `model_checksum` (to check what is deployed, field lesson 16), and each instance
        group's kind as actually used (KIND_GPU without a GPU reads KIND_CPU)."""
        mv = self.registry.get(name, version)
        config = mc.ModelConfig()
        config.CopyFrom(mv.config)
        with_kinds_used(config, mv.devices)
        config.parameters["model_checksum"].string_value = mv.checksum
        return config

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows = self.registry.index(ready_only)
        if not ready_only:
            # As Triton: models in the repository that are not loaded are listed by name.
            listed = {r["name"] for r in rows}
            try:
                on_disk = self.registry.model_names_on_disk()
            except OSError:
                on_disk = []
            rows += [{"name": n} for n in on_disk if n not in listed]
            rows.sort(key=lambda r: (r["name"], int(r.get("version", 0))))
        return rows

    @property
    def workers(self) -> peers.WorkerSlot | None:
        """This process's place among `--workers N` (None: the only server process)."""
        return self._workers

    @workers.setter
    def workers(self, slot: peers.WorkerSlot | None) -> None:
        self._workers = slot
        self.statistics_provider = provider_for(self.model_statistics, slot)

    async def server_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """`model_statistics` of the whole server (workers/statistics.py)."""
        return await self.statistics_provider.model_statistics(name, version)

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of this process: every model when `name` is empty, else its
        (given) versions."""
        if not name:
            names = sorted(self.registry.models)
        elif name not in self.registry.models:
            raise not_found(f"unknown model '{name}'")
        else:
            names = [name]
        stats = []
        for n in names:
            versions = sorted(self.registry.models[n].versions, key=int)
            if version:
                if version not in versions:
                    raise not_found(f"unknown version '{version}' of model '{n}'")
                versions = [version]
            entries = self.statistics.model_stats(n, versions)
            degrade = self.registry.models[n].degrade
            if degrade is not None:  # inferd's own field (HTTP; gRPC's message has none)
                for entry in entries:
                    entry["degradation"] = degradation_statistics(degrade)
            stats.extend(entries)
        return {"model_stats": stats}

    # -- repository and routing administration (Triton's model_repository extension) -----

    def _admin(self, what: str) -> None:
        if not self.admin_api:
            raise InferdError(
                ErrorKind.PERMISSION_DENIED,
                f"{what} is disabled: start inferd with --model-control-mode explicit or "
                "--admin-api on",
            )

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Triton's load: `config` (a JSON model config) and `file:<path>` (bytes) optional."""
        self._admin("the repository API")
        override = None
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            if key == "config":
                if not isinstance(value, str):
                    raise invalid("parameter 'config' must be a JSON string")
                try:
                    override = parse_config_override(name, value)
                except ConfigError as exc:
                    raise invalid(str(exc)) from None
            elif key.startswith("file:"):
                if not isinstance(value, bytes):
                    raise invalid(f"parameter '{key}' must hold the file's bytes")
                files[key.removeprefix("file:")] = value
            else:
                raise invalid(f"unknown load parameter '{key}'; expected 'config' or 'file:<path>'")
        uploads.check_allowed(files, self.model_upload)
        try:
            await self.registry.load_model(name, override, files)
        except ConfigError as exc:
            raise invalid(str(exc)) from None

    async def unload_model(self, name: str) -> None:
        self._admin("the repository API")
        await self.registry.unload_model(name)

    def routing(self, name: str) -> dict[str, Any]:
        model = self.registry.models.get(name)
        if model is None:
            raise not_found(f"unknown model '{name}'")
        router = model.router
        default = model.default_version()
        return {
            "model": name,
            "weights": dict(router.weights),
            "stable": router.stable or (default.version if default else None),
            "rollbacks": dict(router.rollbacks),
            "auto_rollback": router.policy.enabled,
        }

    def set_routing(self, name: str, weights: object) -> dict[str, Any]:
        self._admin("routing changes")
        self.registry.set_weights(name, weights)
        return self.routing(name)

    def promote(self, name: str, version: str) -> dict[str, Any]:
        self._admin("routing changes")
        if not version:
            raise invalid("promote needs the 'version' to send all traffic to")
        self.registry.promote(name, version)
        return self.routing(name)

    def rollback(self, name: str, version: str = "") -> dict[str, Any]:
        self._admin("routing changes")
        self.registry.rollback(name, version)
        return self.routing(name)

    def feedback(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        """A ground-truth label for a captured request (docs/capture.md)."""
        return self.capture.join_feedback(name, doc)

    # -- drift monitoring (docs/monitoring.md) ---------------------------------------------

    def drift(self, name: str, version: str = "") -> dict[str, Any]:
        return drift_api.drift_report(self.registry.get(name, version))

    async def set_drift_reference(
        self, name: str, version: str, body: bytes | dict[str, Any]
    ) -> dict[str, Any]:
        """Body: an .npz archive's bytes, or `{"tensors": {name: rows}}`."""
        self._admin("setting a drift reference")
        mv = self.registry.get(name, version)
        if isinstance(body, bytes):
            reference = await asyncio.to_thread(drift_api.parse_npz_reference, mv, body)
        else:
            reference = await asyncio.to_thread(drift_api.parse_json_reference, mv, body)
        if mv.drift is not None:  # its thread may hold the monitor's lock for a window test
            await asyncio.to_thread(mv.drift.set_reference, reference)
            return drift_api.drift_report(mv)
        return drift_api.install_reference(mv, reference)

    # -- system shared memory (Triton's extension; the table: inferd/dataplane/shm_regions.py) -----

    def _shared_memory_gate(self) -> None:
        """Every change to the shared-memory table passes here, and only here. Registering
        makes the server map (and read and write) an object of the client's choosing; the
        adapters check its credential first (the `shared-memory` API group, see access.py)."""
        if self.workers is not None:
            raise invalid(
                "system shared memory needs a server of one process: with --workers N a "
                "region registered with one worker would be unknown to the worker that "
                "takes the request (with --workers N --engine the one engine holds them)"
            )

    def register_shared_memory(self, name: str, key: object, offset: object, size: object) -> None:
        self._shared_memory_gate()
        self.shared_memory.register(name, key, offset, size)

    def unregister_shared_memory(self, name: str = "") -> None:
        """Region `name`, or every region when "" (an unknown name is no error, as Triton)."""
        self._shared_memory_gate()
        self.shared_memory.unregister(name)

    def shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.shared_memory.status(name)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        """No CUDA region can exist here: none listed, and a named one is unknown."""
        if name:
            raise not_found(f"unknown CUDA shared memory region '{name}'")
        return []

    def register_cuda_shared_memory(self) -> None:
        raise invalid(CUDA_UNSUPPORTED)


def _tensor_meta(spec: TensorSpec, shape: list[int]) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": shape}
