"""Operations that change what the server serves, apart from the request path: loading and
unloading models (Triton's model_repository extension), routing between versions, drift
references, system shared-memory regions, and ground-truth feedback; with the reads of the
same state (routing, drift reports, regions)."""

from __future__ import annotations

import asyncio
from typing import Any

from inferd.config.model_config import ConfigError
from inferd.dataplane import drift_api
from inferd.dataplane.capture import Capture
from inferd.dataplane.shm_regions import CUDA_UNSUPPORTED, SharedMemoryRegistry
from inferd.errors import ErrorKind, InferdError, invalid, not_found
from inferd.repository import uploads
from inferd.repository.loader import parse_config_override
from inferd.repository.registry import ModelRegistry


class Admin:
    def __init__(
        self,
        registry: ModelRegistry,
        shared_memory: SharedMemoryRegistry,
        capture: Capture,
        admin_api: bool = False,
        model_upload: str = "off",
        processes: int = 1,
    ) -> None:
        """`admin_api`: the repository and routing APIs are on; `model_upload`: load's `file:`
        parameters (off, files or code); `processes`: those of `--workers N`."""
        self.registry = registry
        self.shared_memory = shared_memory
        self.capture = capture
        self.admin_api = admin_api
        self.model_upload = model_upload
        self.processes = processes

    def require(self, what: str) -> None:
        """The gate of every change (the trace and log settings' too): PERMISSION_DENIED
        unless the admin API is on."""
        if not self.admin_api:
            raise InferdError(
                ErrorKind.PERMISSION_DENIED,
                f"{what} is disabled: start inferd with --model-control-mode explicit or "
                "--admin-api on",
            )

    # -- the repository (Triton's model_repository extension) -----------------------------

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Triton's load: `config` (a JSON model config) and `file:<path>` (bytes) optional."""
        self.require("the repository API")
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

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Triton's unload: `unload_dependents` optional, and only false (inferd does not
        unload the ensembles made of a model: they stay, UNAVAILABLE until it is back)."""
        self.require("the repository API")
        for key, value in (parameters or {}).items():
            if key != "unload_dependents":
                raise invalid(
                    f"unknown unload parameter '{key[:200]}'; expected 'unload_dependents'"
                )
            if value is not False:
                raise invalid(
                    "unload parameter 'unload_dependents' must be false: inferd does not "
                    "unload the ensembles made of a model (they stay loaded, UNAVAILABLE "
                    "until the model is back)"
                )
        await self.registry.unload_model(name)

    # -- routing between versions (docs/lifecycle.md) --------------------------------------

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
        self.require("routing changes")
        self.registry.set_weights(name, weights)
        return self.routing(name)

    def promote(self, name: str, version: str) -> dict[str, Any]:
        self.require("routing changes")
        if not version:
            raise invalid("promote needs the 'version' to send all traffic to")
        self.registry.promote(name, version)
        return self.routing(name)

    def rollback(self, name: str, version: str = "") -> dict[str, Any]:
        self.require("routing changes")
        self.registry.rollback(name, version)
        return self.routing(name)

    # -- monitoring (docs/capture.md, docs/monitoring.md) ----------------------------------

    def feedback(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        """A ground-truth label for a captured request."""
        return self.capture.join_feedback(name, doc)

    def drift(self, name: str, version: str = "") -> dict[str, Any]:
        return drift_api.drift_report(self.registry.get(name, version))

    async def set_drift_reference(
        self, name: str, version: str, body: bytes | dict[str, Any]
    ) -> dict[str, Any]:
        """Body: an .npz archive's bytes, or `{"tensors": {name: rows}}`."""
        self.require("setting a drift reference")
        mv = self.registry.get(name, version)
        if isinstance(body, bytes):
            reference = await asyncio.to_thread(drift_api.parse_npz_reference, mv, body)
        else:
            reference = await asyncio.to_thread(drift_api.parse_json_reference, mv, body)
        if mv.drift is not None:  # its thread may hold the monitor's lock for a window test
            await asyncio.to_thread(mv.drift.set_reference, reference)
            return drift_api.drift_report(mv)
        return drift_api.install_reference(mv, reference)

    # -- system shared memory (Triton's extension; the table: shm_regions.py) --------------

    def _shared_memory_gate(self) -> None:
        """Every change to the shared-memory table passes here, and only here. Registering
        makes the server map (and read and write) an object of the client's choosing; the
        adapters check its credential first (the `shared-memory` API group, see access.py)."""
        if self.processes > 1:
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
