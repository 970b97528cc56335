"""The protocol-neutral core that the HTTP and gRPC adapters both call.

Adapters translate their wire format into `InferRequest` and back; everything else (lookup,
checks, scheduling, output conformance) happens here, once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd import __version__
from inferd.datatypes import V2_TO_NUMPY
from inferd.errors import ErrorKind, InferdError, invalid, not_found
from inferd.events import CANCELLED, FAILURE_REASON, CallContext, RequestRecord, Telemetry
from inferd.repository.config import ConfigError
from inferd.repository.loader import parse_config_override
from inferd.repository.registry import ModelRegistry, ModelVersion
from inferd.signature import TensorSpec
from inferd.statistics import StatisticsSink
from inferd.types import Array, InferRequest, InferResponse, Tensor

EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
]


class DataPlane:
    def __init__(
        self, registry: ModelRegistry, telemetry: Telemetry, admin_api: bool = False
    ) -> None:
        self.registry = registry
        self.admin_api = admin_api
        self.telemetry = telemetry
        self.statistics = StatisticsSink()
        telemetry.add(self.statistics)
        self.is_shutting_down = False

    # -- health and metadata ------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.is_shutting_down and self.registry.is_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "inferd", "version": __version__, "extensions": EXTENSIONS}

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.registry.get(name, version)
        except InferdError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                raise
            return False
        return True

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
        `model_checksum` (to check what is deployed, field lesson 16)."""
        mv = self.registry.get(name, version)
        config = mc.ModelConfig()
        config.CopyFrom(mv.config)
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

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics: every model when `name` is empty, else its (given) versions."""
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
            stats.extend(self.statistics.model_stats(n, versions))
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

    # -- inference ----------------------------------------------------------------------

    async def infer(
        self,
        model_name: str,
        version: str,
        decode: Callable[[], Awaitable[InferRequest]],
        ctx: CallContext,
    ) -> InferResponse:
        """Decode, check, schedule and answer one request, and tell telemetry how it went.

        `decode` reads and decodes the adapter's wire message: its failures (a malformed
        body) are counted like every other failure, under the model they were sent to.
        """
        # Labels stay "" until resolved: a name or version no model has must not become a
        # label value (clients could otherwise grow the metrics without bound).
        record = RequestRecord(model="", version="", ctx=ctx, duration_ns=0)
        try:
            if model_name in self.registry.models:
                record.model = model_name
            mv = self.registry.get(model_name, version, ctx.routing_key)
            record.version = mv.version
            request = await decode()
            record.request = request
            record.request_id = request.id
            # Resolve again now that the body is in: a version swapped in while it was read
            # takes the request (the old one may be draining), and the request id is known
            # for sticky canary routing.
            mv = self.registry.get(model_name, version, ctx.routing_key or request.id)
            record.version = mv.version
            bound = mv.signature.bind(request)
            record.rows = bound.rows
            assert mv.batcher is not None  # a READY version always has one
            outputs, times = await mv.batcher.submit(bound)
            record.times = times
            t0 = time.perf_counter_ns()
            tensors = [
                _conform_output(mv, mv.signature.outputs[name], outputs, bound.rows)
                for name in bound.output_names
            ]
            times.compute_output_ns += time.perf_counter_ns() - t0
            return InferResponse(
                model_name=mv.name, model_version=mv.version, outputs=tensors, id=request.id
            )
        except InferdError as exc:
            record.failure = FAILURE_REASON[exc.kind]
            record.message = exc.message
            raise
        except asyncio.CancelledError:
            record.failure = CANCELLED
            record.message = "the client cancelled the request"
            raise
        except Exception as exc:
            record.failure = FAILURE_REASON[ErrorKind.INTERNAL]
            record.message = str(exc)
            raise
        finally:
            record.duration_ns = time.perf_counter_ns() - ctx.start_ns
            self.telemetry.request(record)


def _tensor_meta(spec: TensorSpec, shape: list[int]) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": shape}


def _model_error(mv: ModelVersion, message: str) -> InferdError:
    return InferdError(ErrorKind.MODEL_ERROR, f"model '{mv.name}' version {mv.version}: {message}")


def _conform_output(
    mv: ModelVersion, spec: TensorSpec, outputs: dict[str, Array], rows: int
) -> Tensor:
    """Check one output against the config: dtype (cast when safe), shape, reshape."""
    array = outputs.get(spec.name)
    if array is None:
        raise _model_error(mv, f"produced no output '{spec.name}'")
    if spec.datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise _model_error(
                mv, f"output '{spec.name}' is {array.dtype}, but the config declares BYTES"
            )
    else:
        want = V2_TO_NUMPY[spec.datatype]
        if array.dtype != want:
            if not np.can_cast(array.dtype, want, casting="same_kind"):
                raise _model_error(
                    mv,
                    f"output '{spec.name}' is {array.dtype}, which does not convert to the "
                    f"config's {spec.datatype}",
                )
            array = array.astype(want)
    batched = mv.signature.is_batched
    if spec.reshape is not None and -1 not in spec.dims:
        lead = (rows,) if batched else ()
        array = array.reshape(lead + spec.dims)
    inner = array.shape[1:] if batched else array.shape
    if not spec.matches(inner):
        raise _model_error(
            mv,
            f"output '{spec.name}' has shape {list(array.shape)}, but the config declares "
            f"{mv.signature.metadata_shape(spec)}",
        )
    return Tensor(spec.name, spec.datatype, tuple(array.shape), array)
