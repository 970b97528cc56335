"""The canary guard: automatic rollback of a failing canary.

A telemetry sink that watches every weighted version: when a canary's error rate or p99
over the window exceeds the stable version's by the configured margin, it asks the model's
`Router` to drop the canary's weight to 0, and the event is logged and counted.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from inferd.events import BatchRecord, Gone, RequestRecord, forget_keys
from inferd.reliability.routing import Router
from inferd.reliability.sliding_window import SlidingWindow

if TYPE_CHECKING:
    from inferd.repository.registry import ModelRegistry

log = logging.getLogger("inferd.routing")


OUTCOMES_KEPT = 50_000  # per version: past it the window holds the latest requests


class CanaryGuard:
    """Telemetry sink: compares each weighted canary with its stable version."""

    CHECK_EVERY_S = 0.25

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        self._outcomes: dict[tuple[str, str], SlidingWindow] = {}
        self._last_check: dict[str, float] = {}
        self._unchecked: dict[str, int] = {}

    def on_batch(self, record: BatchRecord) -> None:
        pass

    def forget(self, gone: Gone) -> None:
        """Unloaded versions' outcomes go (and an unloaded model's clock)."""
        forget_keys(self._outcomes, gone)
        forget_keys(self._last_check, gone, per_model=True)
        forget_keys(self._unchecked, gone, per_model=True)

    def on_request(self, record: RequestRecord) -> None:
        model = self._registry.models.get(record.model)
        if model is None or not record.version or not model.router.weights:
            return
        router = model.router
        key = (record.model, record.version)
        outcomes = self._outcomes.get(key)
        if outcomes is None:
            outcomes = self._outcomes[key] = SlidingWindow(OUTCOMES_KEPT)
        now = time.monotonic()
        outcomes.record(record.duration_ns / 1e9, record.is_success, now)
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
        base = self._outcomes.get((name, stable))
        base_window = base.summary(policy.window_s, now) if base else None
        base_n, base_err, base_p99 = (
            (base_window.requests, base_window.error_rate, base_window.p99_s)
            if base_window
            else (0, 0.0, 0.0)
        )
        for version, weight in list(router.weights.items()):
            if version == stable or weight == 0:
                continue
            canary = self._outcomes.get((name, version))
            if canary is None:
                continue
            window = canary.summary(policy.window_s, now)
            n, err, p99 = window.requests, window.error_rate, window.p99_s
            if n < policy.min_requests:
                continue
            too_many_errors = err > base_err + policy.error_rate_margin
            too_slow = (
                base_n >= policy.min_requests and base_p99 > 0 and p99 > base_p99 * policy.p99_ratio
            )
            if too_many_errors or too_slow:
                router.guard_rollback(version)
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
