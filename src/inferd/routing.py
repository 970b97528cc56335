"""Canary routing: a model's traffic split between its versions by weight.

With no weights, a request without a version goes to the highest READY version. With
weights (`{"2": 10, "1": 90}`), each request picks a version in proportion; a routing key
(the `inferd-routing-key` header / metadata, else the request id) hashes to a fixed point,
so the same key always lands on the same version while the weights stay the same.

`CanaryGuard`, a telemetry sink, watches every weighted version: when a canary's error rate
or p99 over the window exceeds the stable version's by the configured margin, its weight
drops to 0 (automatic rollback), and the event is logged and counted.
"""

from __future__ import annotations

import json
import logging
import random
import time
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferd.errors import invalid
from inferd.events import BatchRecord, RequestRecord

if TYPE_CHECKING:
    from inferd.repository.registry import ModelRegistry

log = logging.getLogger("inferd.routing")


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


@dataclass(slots=True)
class Router:
    weights: dict[str, int] = field(default_factory=dict)  # empty: the default route
    history: list[dict[str, int]] = field(default_factory=list)  # earlier weights, newest last
    rollbacks: dict[str, int] = field(default_factory=dict)  # automatic rollbacks per version
    policy: RollbackPolicy = field(default_factory=RollbackPolicy)

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

    def change(self, weights: dict[str, int]) -> None:
        """New weights, keeping the old ones so that a rollback can restore them."""
        self.history = [*self.history[-9:], dict(self.weights)]
        self.weights = weights

    @property
    def stable(self) -> str | None:
        """The version with the largest weight (ties: the lowest number)."""
        if not self.weights:
            return None
        return min(self.weights, key=lambda v: (-self.weights[v], int(v)))


@dataclass(slots=True)
class _Outcomes:
    samples: deque[tuple[float, float, bool]] = field(default_factory=lambda: deque(maxlen=50_000))

    def window(self, since: float) -> tuple[int, float, float]:
        """(requests, error rate, p99 seconds) since a monotonic time."""
        while self.samples and self.samples[0][0] < since:
            self.samples.popleft()
        n = len(self.samples)
        if n == 0:
            return 0, 0.0, 0.0
        ok = sorted(lat for _, lat, success in self.samples if success)
        errors = n - len(ok)
        p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else 0.0
        return n, errors / n, p99


class CanaryGuard:
    """Telemetry sink: compares each weighted canary with its stable version."""

    CHECK_EVERY_S = 0.25

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        self._outcomes: dict[tuple[str, str], _Outcomes] = {}
        self._last_check: dict[str, float] = {}
        self._unchecked: dict[str, int] = {}

    def on_batch(self, record: BatchRecord) -> None:
        pass

    def on_request(self, record: RequestRecord) -> None:
        model = self._registry.models.get(record.model)
        if model is None or not record.version or not model.router.weights:
            return
        router = model.router
        key = (record.model, record.version)
        outcomes = self._outcomes.get(key)
        if outcomes is None:
            outcomes = self._outcomes[key] = _Outcomes()
        now = time.monotonic()
        outcomes.samples.append((now, record.duration_ns / 1e9, record.is_success))
        if not router.policy.enabled:
            return
        # Check every CHECK_EVERY_S, or sooner after min_requests new outcomes: a failing
        # canary is caught within a bounded number of requests however fast they come.
        unchecked = self._unchecked.get(record.model, 0) + 1
        self._unchecked[record.model] = unchecked
        if (
            now - self._last_check.get(record.model, 0) < self.CHECK_EVERY_S
            and unchecked < router.policy.min_requests
        ):
            return
        self._last_check[record.model] = now
        self._unchecked[record.model] = 0
        self._check(record.model, router, now)

    def _check(self, name: str, router: Router, now: float) -> None:
        stable = router.stable
        if stable is None:
            return
        policy = router.policy
        since = now - policy.window_s
        base = self._outcomes.get((name, stable))
        base_n, base_err, base_p99 = base.window(since) if base else (0, 0.0, 0.0)
        for version, weight in list(router.weights.items()):
            if version == stable or weight == 0:
                continue
            canary = self._outcomes.get((name, version))
            if canary is None:
                continue
            n, err, p99 = canary.window(since)
            if n < policy.min_requests:
                continue
            too_many_errors = err > base_err + policy.error_rate_margin
            too_slow = (
                base_n >= policy.min_requests and base_p99 > 0 and p99 > base_p99 * policy.p99_ratio
            )
            if too_many_errors or too_slow:
                router.weights[version] = 0
                router.rollbacks[version] = router.rollbacks.get(version, 0) + 1
                log.warning(
                    "automatic rollback: model %s version %s weight -> 0 (error rate %.1f%% vs "
                    "stable v%s %.1f%%, p99 %.1f ms vs %.1f ms over %d requests)",
                    name,
                    version,
                    100 * err,
                    stable,
                    100 * base_err,
                    1000 * p99,
                    1000 * base_p99,
                    n,
                    extra={"model": name, "version": version, "event": "canary_rollback"},
                )
