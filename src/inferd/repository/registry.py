"""The model registry: which model versions exist, their states, and swapping them safely.

A model whose config is broken, or a version that fails to load or warm up, is marked
UNAVAILABLE with the reason; every other model keeps serving. Reloading loads and warms the
new version beside the old one, switches routing in one step (a dict assignment on the event
loop), then drains the old one's queued and running requests and releases it.

The registry decides and swaps; what it keeps per model is model_state.py, one version's load
attempt version_load.py, and the checks of a load call's name and files uploads.py.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.python.pb_utils.host import HostProvider
from inferd.cache.model_cache_spec import served_cache
from inferd.config.model_config import CONFIG_FILE, ConfigError
from inferd.errors import InferdError, invalid, not_found, unavailable
from inferd.events import Telemetry
from inferd.pipelines.ensemble_config import is_ensemble
from inferd.reliability.circuit import CircuitBreaker
from inferd.reliability.routing import parse_weights
from inferd.repository import ensemble_state as ensembles
from inferd.repository.checksum import checksum, file_checksum, fingerprint
from inferd.repository.degrade_reload import configure_degradation
from inferd.repository.ensemble_load import Composing
from inferd.repository.loader import prepare
from inferd.repository.memory_release import MemoryReleaser, rss_bytes
from inferd.repository.model_state import (
    Model,
    ModelVersion,
    State,
    first_reason,
    latest_reason,
    ready_versions,
)
from inferd.repository.spec import ModelSpec
from inferd.repository.uploads import check_model_name, checked_paths, write_files
from inferd.repository.version_load import load_version
from inferd.tensors.classification import read_labels
from inferd.tensors.signature import ModelSignature

log = logging.getLogger("inferd.repository")

UNLOADED = "unloaded"  # the reason of a model unloaded on request (the repository API)


class ModelRegistry:
    def __init__(
        self,
        repository: Path,
        telemetry: Telemetry | None = None,
        execution_timeout_ms: int = 0,
    ) -> None:
        """`execution_timeout_ms`: the models' default (`--execution-timeout-ms`; 0: none)."""
        self.repository = repository
        self.telemetry = telemetry or Telemetry()
        self.execution_timeout_ms = execution_timeout_ms
        self.models: dict[str, Model] = {}
        # Versions swapped out or unloaded whose last requests are still draining: their
        # series and per-version state stay until the unload completes (`holds`).
        self.draining: set[tuple[str, str]] = set()
        # What Python models may ask of the server (pb_utils); set by the server.
        self.model_host: HostProvider | None = None
        self.memory = MemoryReleaser()
        # Whether the server has a response cache (--cache-config); set by the server.
        self.cache_enabled = False
        self.cache_local = False  # and whether it has a local tier (cache_max_entries bounds it)
        self.on_retire: Callable[[str], None] | None = None  # the cache's invalidate_model
        # After each change of what serves: --engine pushes its model table (engine/).
        self.changed: Callable[[], None] = lambda: None
        # Counts those changes (loads, unloads, reloads, routing): what is derived from the
        # models (the HTTP adapter's OpenAPI document) is rebuilt when it moves.
        self.generation = 0

    def _changed(self) -> None:
        self.generation += 1
        self.changed()

    # -- lookups on the request path ----------------------------------------------------

    def get(self, name: str, version: str = "", routing_key: str = "") -> ModelVersion:
        model = self.models.get(name)
        if model is None:
            raise not_found(f"unknown model '{name}'")
        if not version:
            versions = model.versions
            if len(versions) == 1 and not model.router.weights:  # inline: every request
                (only,) = versions.values()
                if only.state is State.READY:
                    return only
            routed = (
                model.router.pick(model.versions, routing_key) if model.router.weights else None
            )
            mv = model.versions.get(routed) if routed else None
            if mv is None or not mv.is_ready:
                mv = model.default_version()
            if mv is None:
                reason = model.reason or first_reason(model)
                raise unavailable(
                    f"model '{name}' has no ready version" + (f": {reason}" if reason else "")
                )
            return mv
        mv = model.versions.get(version)
        if mv is None:
            raise not_found(f"unknown version '{version}' of model '{name}'")
        if not mv.is_ready:
            reason = latest_reason(model, mv)
            raise unavailable(
                f"model '{name}' version {version} is {mv.state.value}"
                + (f": {reason}" if reason else "")
            )
        return mv

    def holds(self, model: str, version: str) -> bool:
        """Whether what is kept for (model, version) still belongs (/metrics' series, the
        statistics, per-version windows): a version in the index (loaded, or failed to load)
        or draining its last requests; for version "" (a request no version took) a model
        of the registry that is not unloaded; for model "" (a name the repository lacks)
        always. The rest goes when an unload completes (`_forget`), as Triton drops an
        unloaded version's metrics."""
        if not model:
            return True
        entry = self.models.get(model)
        if entry is None:
            return False
        if not version:
            return bool(entry.versions) or entry.reason != UNLOADED
        return version in entry.versions or (model, version) in self.draining

    def _forget(self) -> None:
        """An unload completed: every part drops what it kept for versions and models that
        are gone (this one's, and any a late request's record brought back since the last
        unload). On the loop, with no await: nothing is recorded meanwhile."""
        for model in self.models.values():
            unloaded = functools.partial(self._gone, model.name)
            model.router.forget(unloaded)
            if model.degrade is not None:
                model.degrade.forget_unloaded(unloaded)
        self.telemetry.forget(self._gone)

    def _gone(self, model: str, version: str) -> bool:
        return not self.holds(model, version)

    def is_ready(self) -> bool:
        """Every model (but those unloaded on request, and ensembles waiting for one) can
        serve: it has a READY version."""
        return all(
            m.default_version() is not None
            for m in self.models.values()
            if m.reason != UNLOADED and not ensembles.only_waits(m)
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
                reason = latest_reason(model, v) or v.warning
                if reason:
                    row["reason"] = reason
                rows.append(row)
        return rows

    # -- lifecycle ----------------------------------------------------------------------

    def model_names_on_disk(self) -> list[str]:
        if not self.repository.is_dir():
            raise FileNotFoundError(f"model repository {self.repository} is not a directory")
        return sorted(
            p.name
            for p in self.repository.iterdir()
            if p.is_dir() and not p.name.startswith((".", "_"))
        )

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load models (all on disk by default); one that fails is logged and listed, the
        others load regardless."""
        wanted = self.model_names_on_disk() if names is None else names
        # Ensembles after the models they are made of, so they start READY.
        later = set(await asyncio.to_thread(ensembles.ensembles_among, self.repository, wanted))
        await asyncio.gather(*(self._load_logged(n) for n in wanted if n not in later))
        await asyncio.gather(*(self._load_logged(n) for n in wanted if n in later))

    def _composing(self) -> Callable[[str, str], Composing]:
        return ensembles.lookup(self.models, self.model_names_on_disk)

    def _refresh_ensembles(self) -> None:
        """After any load or unload: the ensembles' states follow their composing models."""
        ensembles.refresh_ensembles(self.models, self._composing())

    async def _load_logged(self, name: str) -> None:
        try:
            await self.load_model(name)
        except InferdError as exc:
            if name not in self.models:  # not even a directory: keep it visible in the index
                self.models[name] = Model(name, reason=exc.message)
                log.error("model %s failed: %s", name, exc.message)

    async def load_model(
        self,
        name: str,
        override: mc.ModelConfig | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Load `name`, or reload it: changed or new versions are loaded and warmed beside the
        serving ones and swapped in; versions no longer selected drain and unload.

        A failure never replaces a working version. Raises InferdError (for the repository
        API) when the model cannot be loaded at all; the reason is kept in the index too.
        """
        # Everything the caller sent is checked before the registry changes: a refused
        # call leaves no trace (no entry that holds server readiness down).
        check_model_name(name)
        paths = checked_paths(files) if files else {}
        if files and override is None:
            raise invalid("file: parameters need a 'config' parameter as well (Triton's rule)")
        model = self.models.get(name)
        created = model is None
        if model is None:
            model = self.models[name] = Model(name)
        try:
            async with model.lock:
                if files:
                    with tempfile.TemporaryDirectory(prefix="inferd-") as tmp:
                        model_dir = Path(tmp) / name
                        await asyncio.to_thread(write_files, model_dir, paths, files)
                        await self._load_locked(model, model_dir, override)
                    return
                model_dir = self.repository / name
                if not model_dir.is_dir():
                    if not model.versions:
                        del self.models[name]
                    raise not_found(f"no model '{name}' in the repository")
                await self._load_locked(model, model_dir, override)
        except BaseException:
            # A model this call added that got no version and no recorded reason (its
            # files could not be read or written) is forgotten again; one whose load was
            # tried keeps its reason in the index, as Triton's does.
            forget = created and not model.versions and not model.reason
            if forget and self.models.get(name) is model:
                del self.models[name]
            raise
        finally:
            self._refresh_ensembles()
            self._changed()

    async def _load_locked(
        self, model: Model, model_dir: Path, override: mc.ModelConfig | None
    ) -> None:
        reloading = bool(model.versions)
        seen = await asyncio.to_thread(fingerprint, model_dir)
        try:
            config, backend, numbers, spec = await asyncio.to_thread(prepare, model_dir, override)
            timeout_s = spec.execution_timeout_s(self.execution_timeout_ms)
            signature = ModelSignature(config, spec.limits)
            signature.model_parameters = getattr(backend, "passes_request_parameters", False)
            signature.labels = await asyncio.to_thread(read_labels, config, model_dir)
            signature.text_inputs = spec.text_inputs
            sequence = spec.sequence
            cache = served_cache(model.name, spec.cache, self.cache_enabled, self.cache_local)
            if sequence is not None:
                signature.server_inputs.update(sequence.server_inputs())
            if backend.decodes_bytes_as_text:
                signature.text_inputs = frozenset(
                    n for n, t in signature.inputs.items() if t.datatype == "BYTES"
                )
        except (ConfigError, InferdError, OSError, ValueError) as exc:
            message = exc.message if isinstance(exc, InferdError) else str(exc)
            model.load_failures += 1
            if model.default_version() is not None:
                model.reason = f"reload failed, still serving the loaded versions: {message}"
            else:
                model.reason = message
            model.seen = seen
            log.error("model %s failed: %s", model.name, message)
            # Reading the model file to complete its config may have loaded it once.
            await self._release(model.name, [], "load_failed", rss_bytes())
            raise invalid(message) from None
        sums = await asyncio.to_thread(
            lambda: {str(n): checksum(model_dir / str(n)) for n in numbers}
        )
        config_sum = await asyncio.to_thread(file_checksum, model_dir / CONFIG_FILE)
        config_sum = config_sum + "|" + str(config)  # an override changes it too
        # So do the classification labels: loaded versions hold the ones read with them.
        config_sum += "|" + repr(sorted(signature.labels.items()))
        config_changed = config_sum != model.config_checksum
        keep: dict[str, ModelVersion] = {}
        fresh: list[ModelVersion] = []
        config_digest = hashlib.blake2b(config_sum.encode(), digest_size=8).hexdigest()
        for v, digest in sums.items():
            old = model.versions.get(v)
            if old is not None and old.is_ready and not config_changed and old.checksum == digest:
                old.reason = ""  # this attempt found it fine: an earlier failure is history
                keep[v] = old
            else:
                fresh.append(
                    ModelVersion(
                        model.name,
                        v,
                        config,
                        signature,
                        spec,
                        checksum=digest,
                        sequence=sequence,
                        execution_timeout_s=timeout_s,
                        cache=cache,
                        cache_version=f"{v}:{digest}:{config_digest}",
                    )
                )
        versions = [mv for mv in fresh if not is_ensemble(mv.config)]
        args = (backend, model_dir, self.model_host, self.telemetry)
        await asyncio.gather(*(load_version(mv, *args) for mv in versions))
        for mv in fresh:
            if is_ensemble(mv.config):  # its state follows its composing models
                ensembles.start_ensemble(mv, self._composing())

        for mv in fresh:
            old = model.versions.get(mv.version)
            if mv.is_ready or old is None or not old.is_ready:
                keep[mv.version] = mv
            else:  # a broken replacement never replaces a working version
                old.reason = f"reload failed, still serving the loaded files: {mv.reason}"
                keep[mv.version] = old
                model.load_failures += 1
        if not any(v.is_ready for v in keep.values()):
            for v, old in model.versions.items():
                if old.is_ready and v not in keep:
                    old.reason = "kept serving: no newer version loaded"
                    keep[v] = old
        failed = [mv for mv in fresh if not mv.is_ready and not mv.waits_for]
        model.load_failures += sum(1 for mv in failed if mv.version not in model.versions)
        retired = [old for v, old in model.versions.items() if keep.get(v) is not old]
        # The switch: one assignment, between two requests, on the event loop.
        model.versions = keep
        model.config = (
            config if any(mv.is_ready for mv in fresh) or not model.config else model.config
        )
        model.config_checksum = config_sum if not failed else model.config_checksum
        model.seen = seen
        model.reason = ""  # the config passed this time; version failures are on their rows
        model.router.configure(spec.canary, _config_weights(model, spec))
        if model.circuit.policy != spec.circuit or model.circuit.model != model.name:
            held = model.circuit.held  # a degradation tier's hold outlives a new policy
            model.circuit = CircuitBreaker(model.name, spec.circuit, held=held)
        configure_degradation(model, spec.degrade)
        self._changed()  # now, not after the old versions drained
        if retired:
            await self._retire(retired)
        elif failed:
            await self._release(
                model.name, [mv.version for mv in failed], "load_failed", rss_bytes()
            )
        elif reloading:
            # Nothing swapped, but the pass read the model to check it (config completion,
            # checksums): give that back too, or it stays until the next swap. (The
            # repository's first load ends with one trim for every model: server/build.py.)
            await self._release(model.name, [], "reloaded", rss_bytes())
        if failed:
            # As Triton: the load call fails when a version did not load, even though the
            # working versions kept serving (the caller must not take it for the new one).
            detail = "; ".join(f"version {mv.version}: {mv.reason}" for mv in failed)
            ready = sorted((v for v, mv in keep.items() if mv.is_ready), key=int)
            serving = f"; still serving version {', '.join(ready)}" if ready else ""
            raise invalid(f"model '{model.name}' failed to load: {detail}{serving}")

    async def _retire(self, versions: list[ModelVersion], release: bool = True) -> None:
        """Drain and close versions that no longer take new requests; then (`release`) give
        their memory back to the operating system, and forget what was kept for them."""
        rss_before = rss_bytes()
        keys = {(mv.name, mv.version) for mv in versions}
        self.draining.update(keys)
        for mv in versions:
            if mv.is_ready:
                mv.state = State.UNLOADING
        try:
            await asyncio.gather(*(v.batcher.stop() for v in versions if v.batcher is not None))
            for mv in versions:
                mv.batcher = None
                mv.state = State.UNAVAILABLE
                mv.reason = "unloaded"
            if self.on_retire is not None and versions:  # cache entries no key can reach
                self.on_retire(versions[0].name)
            if release and versions:
                name = versions[0].name  # one model's versions: the callers hold its lock
                await self._release(name, [mv.version for mv in versions], "unloaded", rss_before)
        finally:
            # Drained and answered: their series and statistics go now, as Triton's go
            # with an unloaded version (docs/metrics.md, "Series of unloaded versions").
            self.draining.difference_update(keys)
            self._forget()
        for mv in versions:  # drained, released and forgotten: the unload is complete
            log.info("unloaded model %s version %s", mv.name, mv.version)

    async def _release(self, model: str, versions: list[str], why: str, rss_before: int) -> None:
        """Collect and trim in a worker thread: the memory goes back to the OS now, not at
        some later collection, and the loop keeps serving meanwhile."""
        await asyncio.to_thread(self.memory.release, model, versions, why, rss_before)

    async def unload_model(self, name: str, forget: bool = False) -> None:
        """Drain and unload every version; the model stays in the index as unloaded (or,
        `forget`, leaves it). What was counted for it starts again from zero at its next
        load, as Triton's does."""
        model = self._model(name)
        async with model.lock:
            retired = list(model.versions.values())
            model.versions = {}
            model.reason = UNLOADED
            model.config_checksum = ""
            model.router.clear()
            model.load_failures = 0
            model.circuit = CircuitBreaker(model.name, model.circuit.policy)
            configure_degradation(model, None)  # a later load starts from tier 0
            if forget:
                del self.models[name]
            self._changed()
            # (With nothing to drain too: the model's own series go.)
            await self._retire([v for v in retired if v.batcher is not None])
        self._refresh_ensembles()
        self._changed()

    async def unload_all(self) -> None:
        """At shutdown: every version drains and closes (no trim: the process exits)."""
        versions = [v for m in self.models.values() for v in m.versions.values()]
        await self._retire([v for v in versions if v.batcher is not None], release=False)

    # -- routing between loaded versions (the repository API's routing, promote, rollback) --

    def set_weights(self, name: str, raw: object) -> dict[str, int]:
        model = self._model(name)
        weights = parse_weights(raw, f"model '{name}' routing")
        model.router.set_weights(weights, ready_versions(model), name)
        self._changed()
        log.info("model %s routing weights set to %s", name, weights)
        return weights

    def promote(self, name: str, version: str) -> dict[str, int]:
        model = self._model(name)
        model.router.promote(version, ready_versions(model), name)
        self._changed()
        log.info("model %s routing weights set to %s", name, model.router.weights)
        return dict(model.router.weights)

    def rollback(self, name: str, version: str = "") -> dict[str, int]:
        """Undo the last step forward (`Router.rollback`)."""
        model = self._model(name)
        model.router.rollback(version, name)
        self._changed()
        log.info("model %s rolled back; routing weights now %s", name, model.router.weights)
        return dict(model.router.weights)

    def _model(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise not_found(f"unknown model '{name}'")
        return model


def _config_weights(model: Model, spec: ModelSpec) -> dict[str, int] | None:
    """Weights from the config's `canary_weights` parameter (parsed, and checked, with the
    spec) for the loaded versions, when it sets them."""
    weights = spec.canary_weights
    if weights is None:
        return None
    return {v: w for v, w in weights.items() if v in model.versions}
