"""Canary routing: a model's traffic split between its versions by weight.

With no weights, a request without a version goes to the highest READY version. With
weights (`{"2": 10, "1": 90}`), each request picks a version in proportion; a routing key
(the `inferd-routing-key` header / metadata, else the request id) hashes to a fixed point,
so the same key always lands on the same version while the weights stay the same.

`Router` owns the weights; the automatic rollback that drops a failing canary's weight to 0
(`inferd.repository.canary_guard.CanaryGuard`) asks it to.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from inferd.errors import invalid


@dataclass(frozen=True, slots=True)
class RollbackPolicy:
    enabled: bool = False
    window_s: float = 30.0
    min_requests: int = 20
    error_rate_margin: float = 0.05  # canary errors may exceed stable's by this much
    p99_ratio: float = 2.0  # canary p99 may be at most this many times stable's


def parse_weights(raw: object, where: str) -> dict[str, int]:
    """`{"2": 10, "1": 90}` (a dict or its JSON text) -> weights; errors name the field."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise invalid(f"{where}: weights are not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise invalid(f'{where}: weights must be an object like {{"2": 10, "1": 90}}')
    weights: dict[str, int] = {}
    for version, weight in raw.items():
        if not str(version).isdigit():
            raise invalid(f"{where}: version '{version}' must be a number")
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
            raise invalid(f"{where}: weight of version {version} must be an integer >= 0")
        weights[str(int(version))] = weight
    if sum(weights.values()) == 0:
        raise invalid(f"{where}: at least one weight must be > 0")
    return weights


class Router:
    """A model's traffic split. It owns its state: every change (weights set, promote,
    rollback by hand or by the canary guard, unload) goes through a method here, so the
    history a rollback restores and the rollback counts stay whole. Readers get read-only
    views; each change of the weights assigns a new dict, so a scrape thread reading them
    (snapshots.items) never sees a dict change size."""

    __slots__ = ("_history", "_policy", "_rollbacks", "promoted", "weights")

    def __init__(self) -> None:
        # Empty: the default route. An attribute, not a property: the request path reads it
        # on every request. Only this class assigns it, a new dict at each change.
        self.weights: Mapping[str, int] = {}
        self._history: list[dict[str, int]] = []  # earlier weights, newest last
        self._rollbacks: dict[str, int] = {}  # automatic rollbacks per version
        self._policy = RollbackPolicy()
        # (version, monotonic time) while the last change was a promote: what a degradation
        # tier's rollback may undo (None after any other change)
        self.promoted: tuple[str, float] | None = None

    @property
    def rollbacks(self) -> Mapping[str, int]:
        return self._rollbacks

    @property
    def policy(self) -> RollbackPolicy:
        return self._policy

    def pick(self, ready: Mapping[str, object], key: str) -> str | None:
        """The version for one request, or None for the default route."""
        candidates = sorted(
            ((v, w) for v, w in self.weights.items() if w > 0 and v in ready),
            key=lambda x: int(x[0]),
        )
        if not candidates:
            return None
        total = sum(w for _, w in candidates)
        point = zlib.crc32(key.encode()) % total if key else random.randrange(total)
        for version, weight in candidates:
            if point < weight:
                return version
            point -= weight
        return candidates[-1][0]

    @property
    def stable(self) -> str | None:
        """The version with the largest weight (ties: the lowest number)."""
        if not self.weights:
            return None
        return min(self.weights, key=lambda v: (-self.weights[v], int(v)))

    def set_weights(self, weights: dict[str, int], ready: Container[str], model: str) -> None:
        """New weights (a version taking traffic must be `ready`), keeping the old ones so
        that a rollback can restore them."""
        for version, weight in weights.items():
            if weight > 0 and version not in ready:
                raise invalid(f"model '{model}' version {version} is not loaded and ready")
        self._change(weights)

    def promote(self, version: str, ready: Container[str], model: str) -> None:
        """All traffic to `version`."""
        self.set_weights({version: 100}, ready, model)
        # Undoable only with earlier weights to restore (not from the default route).
        self.promoted = (version, time.monotonic()) if self._history[-1] else None

    def rollback(self, version: str, model: str) -> None:
        """Undo the last step forward: a canary's traffic goes back to the stable version
        (`version`, default every canary, -> weight 0); with no canary taking traffic, the
        weights before the last change (e.g. before a promote) come back."""
        stable = self.stable
        canaries = [v for v, w in self.weights.items() if v != stable and w > 0]
        if version:
            if self.weights.get(version, 0) == 0 or version == stable:
                raise invalid(f"model '{model}' version {version} is not a canary taking traffic")
            canaries = [version]
        if canaries:
            self._change({v: (0 if v in canaries else w) for v, w in self.weights.items()})
        elif self._history and self._history[-1]:
            self.weights = self._history.pop()
            self.promoted = None
        else:
            raise invalid(f"model '{model}' has no canary or earlier routing to roll back to")

    def guard_rollback(self, version: str) -> None:
        """The canary guard's automatic rollback: the version's weight drops to 0, counted."""
        self.weights = {**self.weights, version: 0}  # a new dict, as every change
        self._rollbacks[version] = self._rollbacks.get(version, 0) + 1
        self.promoted = None

    def configure(self, policy: RollbackPolicy, weights: Mapping[str, int] | None) -> None:
        """After a (re)load: the config's rollback policy, and its `canary_weights` (when it
        sets them) for the versions that are loaded. Not a step a rollback undoes."""
        self._policy = policy
        if weights is not None:
            self.weights = dict(weights)
            self.promoted = None

    def clear(self) -> None:
        """The model unloaded: back to the default route."""
        self.weights = {}
        self.promoted = None
        self._rollbacks = {}

    def forget(self, gone: Callable[[str], bool]) -> None:
        """Versions unloaded: their weights (which routed nothing: `pick` takes ready
        versions only) and rollback counts go. The history a rollback restores keeps them
        (ten entries at most); restored, they route nothing either."""
        if any(gone(v) for v in self.weights):
            self.weights = {v: w for v, w in self.weights.items() if not gone(v)}
        if any(gone(v) for v in self._rollbacks):
            self._rollbacks = {v: n for v, n in self._rollbacks.items() if not gone(v)}

    def _change(self, weights: dict[str, int]) -> None:
        self._history = [*self._history[-9:], dict(self.weights)]
        self.weights = weights
        self.promoted = None  # promote() sets it again after its own change
