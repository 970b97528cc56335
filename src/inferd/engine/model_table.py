"""The model table of `--engine`: what a front end needs to check a request against its
model's signature before the hop, pushed by the engine on connect and on every change.

The engine (`ModelTable`) describes each READY version's `ModelSignature` in plain values
(the config as protobuf bytes, its input limits, the inputs the server feeds, the text
inputs) under a generation number; versions whose signatures are equal share one. A front
end (`FrontTable`) rebuilds `ModelSignature` objects from it and runs their own checks on
each request (`ModelSignature.check`: `bind`'s, in its order), so its errors are one
process's, word for word, and a bad request never crosses the hop (only a note of it, for
the engine's statistics). It checks only where it knows the version the engine will pick: the one
named, or, for a request that names none, the one signature every routable version has.

The engine trusts a front end's check only when the request carries the generation of the
signature of the version it chose, as published now (`is_current`); otherwise it checks
itself. A front end whose table is late (a push in flight) is therefore never trusted for
a signature that changed, and a request is never accepted unchecked.

What a front end never checks, leaving it to the engine as one process orders it: requests
naming shared-memory regions (their data is the engine's to map), decoupled versions (refused
for a unary call first) and models with a circuit breaker (an open circuit answers first).
What one process checks before the body is read (shutting down, --max-inflight-requests, a
full queue) the engine checks for a request the front end refused too, before the front end
answers (engine_client.py, `refusal`): a request that is both malformed and shed gets the 429
as in one process.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.input_limits import InputLimits
from inferd.tensors.signature import ModelSignature
from inferd.types import InferRequest

if TYPE_CHECKING:
    from inferd.repository.model_state import Model, ModelVersion

# One model's entry: (generation for a request naming no version, 0: the front end does not
# check those; {version: (generation, signature description)}).
Entry = tuple[int, dict[str, tuple[int, tuple[Any, ...]]]]


def describe(signature: ModelSignature, config: mc.ModelConfig) -> tuple[Any, ...]:
    """`signature` in plain values (marshal carries them), all `rebuild` needs."""
    limits = signature.limits
    return (
        config.SerializeToString(deterministic=True),
        (limits.max_shape, limits.max_elements, limits.max_bytes_element_size),
        signature.server_inputs,
        sorted(signature.text_inputs),
        signature.model_parameters,
    )


def rebuild(description: tuple[Any, ...]) -> ModelSignature:
    """The `ModelSignature` that `describe` described: the same checks, the same messages."""
    config_bytes, (max_shape, max_elements, max_bytes), server_inputs, text, params = description
    limits = InputLimits(dict(max_shape), max_elements, max_bytes)
    signature = ModelSignature(mc.ModelConfig.FromString(config_bytes), limits)
    signature.server_inputs = dict(server_inputs)
    signature.text_inputs = frozenset(text)
    signature.model_parameters = params
    return signature


def routable(model: Model) -> list[ModelVersion]:
    """Every READY version a request naming none may reach: those with routing weight and
    the default (the registry's fallback when a weighted pick is not ready). A superset is
    safe: it only makes a front end check less; so the canary guard's automatic rollback,
    which only takes routes away, pushes no new table."""
    chosen = {v: mv for v, mv in model.versions.items() if mv.is_ready}
    weights = model.router.weights
    out = [mv for v, mv in chosen.items() if weights.get(v, 0) > 0]
    default = model.default_version()
    if default is not None and default not in out:
        out.append(default)
    return out


class ModelTable:
    """The engine's side: builds the table from the registry, and says whether a request's
    front-end check holds for the version chosen for it."""

    def __init__(self, models: dict[str, Model]) -> None:
        self.models = models
        self.message: dict[str, Entry] = {}
        self._current: dict[ModelVersion, int] = {}  # READY versions -> their generation
        self._generations: dict[bytes, int] = {}  # description -> generation, as published
        # Generations start at this engine's start time: a restarted engine's never equal a
        # dead one's, whatever table a front end still holds.
        self._last = time.time_ns()

    def is_current(self, mv: ModelVersion, generation: int) -> bool:
        """The front end checked against the signature `mv` has now."""
        return self._current.get(mv) == generation

    def refresh(self) -> dict[str, Entry]:
        """Rebuild from the registry (after any change); returns the new table."""
        generations: dict[bytes, int] = {}
        current: dict[ModelVersion, int] = {}
        table: dict[str, Entry] = {}
        for name, model in self.models.items():
            if model.circuit.policy.enabled or model.degrade is not None:
                # An open circuit or a degradation tier (a fallback, a stale answer) answers
                # before any signature is checked: the engine checks these itself.
                continue
            versions: dict[str, tuple[int, tuple[Any, ...]]] = {}
            for v, mv in model.versions.items():
                if not mv.is_ready or mv.decoupled:
                    continue
                description = describe(mv.signature, mv.config)
                key = repr(description).encode()
                generation = generations.get(key) or self._generations.get(key)
                if generation is None:
                    self._last += 1
                    generation = self._last
                generations[key] = generation
                current[mv] = generation
                versions[v] = (generation, description)
            if versions:
                table[name] = (self._unnamed(model, current), versions)
        self._generations, self._current, self.message = generations, current, table
        return table

    @staticmethod
    def _unnamed(model: Model, current: dict[ModelVersion, int]) -> int:
        seen = {current.get(mv, 0) for mv in routable(model)}
        return seen.pop() if len(seen) == 1 else 0  # 0 in it: a decoupled version


class FrontTable:
    """A front end's side: the signatures, rebuilt from the engine's latest table."""

    def __init__(self) -> None:
        # model -> (generation and signature for a request naming no version, or None;
        # {version: (generation, signature)})
        self._models: dict[str, tuple[_Checked | None, dict[str, _Checked]]] = {}

    def clear(self) -> None:
        """The engine went away: nothing of its table stands for the next one's."""
        self._models = {}

    def update(self, table: dict[str, Entry]) -> None:
        # Signatures of generations already rebuilt are kept (one engine numbers each
        # signature once): a push after an unrelated change rebuilds nothing.
        old = {c[0]: c for _, versions in self._models.values() for c in versions.values()}
        models: dict[str, tuple[_Checked | None, dict[str, _Checked]]] = {}
        for name, (unnamed, versions) in table.items():
            rebuilt = {
                v: old.get(gen) or (gen, rebuild(description))
                for v, (gen, description) in versions.items()
            }
            old.update((c[0], c) for c in rebuilt.values())
            models[name] = (old.get(unnamed) if unnamed else None, rebuilt)
        self._models = models

    def check(self, request: InferRequest) -> int:
        """Check `request` as the engine would (raises its InferdError); the generation it
        was checked against, or 0 when this front end cannot tell which version takes it."""
        entry = self._models.get(request.model_name)
        if entry is None or request.uses_shared_memory:
            return 0
        found = entry[1].get(request.model_version) if request.model_version else entry[0]
        if found is None:
            return 0
        found[1].check(request)
        return found[0]


_Checked = tuple[int, ModelSignature]  # a signature and its generation
