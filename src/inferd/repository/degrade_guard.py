"""The telemetry sink that moves models between degradation tiers, and what a move does
besides routing (which the request path reads from `Degradation`): it holds the circuit
open while a tier says so, rolls a slow canary or a fresh promote back on entering a
`rollback` tier, and logs every move with the p99 that caused it."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from inferd.errors import InferdError
from inferd.events import RequestRecord
from inferd.reliability.degrade.controller import Degradation, TierChange

if TYPE_CHECKING:
    from inferd.repository.model_state import Model
    from inferd.repository.registry import ModelRegistry

log = logging.getLogger("inferd.degrade")

# Requests the model did not answer in time, their client gone or their deadline passed:
# their duration is a lower bound of its latency.
OUT_OF_TIME = frozenset({"cancelled", "timeout"})


class DegradationGuard:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def on_request(self, record: RequestRecord) -> None:
        model = self._registry.models.get(record.model)
        if model is None or model.degrade is None or not record.version:
            return
        latency_s = slowness(record)
        if latency_s is None:
            return  # a cache hit, a refusal, a bad request: nothing about the model's speed
        now = time.monotonic()
        change = model.degrade.observe(record.version, latency_s, now)
        if change is not None:
            self.apply(model, model.degrade, change, now)

    def apply(self, model: Model, degrade: Degradation, change: TierChange, now: float) -> None:
        if change.kind != "move":
            self._trial(model, degrade, change)
            return
        tiers = degrade.policy.tiers
        new = tiers[change.new - 1] if change.new else None
        old = tiers[change.old - 1] if change.old else None
        why = f"p99 {change.p99_s * 1000:.0f} ms over {change.requests} requests"
        if new is not None and change.new > change.old:
            damped = (
                f"; re-entered soon after leaving: it leaves no sooner than {degrade.dwell_s:g} s"
                " (the dwell time doubles with each quick re-entry)"
                if degrade.damping
                else ""
            )
            log.warning(
                "model %s: %s is past tier %d's %.0f ms: degraded to tier %d (%s)%s",
                model.name,
                why,
                new.number,
                new.p99_s * 1000,
                new.number,
                new.describe(),
                damped,
                extra=_event(model.name, change),
            )
        else:
            assert old is not None
            log.warning(
                "model %s: %s is under tier %d's release point (%.0f ms x %g) after at least "
                "%g s in it: %s",
                model.name,
                why,
                old.number,
                old.p99_s * 1000,
                degrade.policy.release_ratio,
                degrade.dwell_s,
                f"back to tier {new.number} ({new.describe()})" if new else "no longer degraded",
                extra=_event(model.name, change),
            )
        if new is not None and change.new > change.old and (new.fallback_share or new.open_circuit):
            self._check_fallback(model, degrade, new.number)
        holds = new is not None and new.open_circuit
        if holds and not (old is not None and old.open_circuit):
            model.circuit.hold_open(f"degradation tier {change.new}: {why}")
        elif not holds and old is not None and old.open_circuit:
            model.circuit.release_hold()
        if new is not None and new.rollback and change.new > change.old:
            self._rollback(model, degrade, change, now)

    def _trial(self, model: Model, degrade: Degradation, change: TierChange) -> None:
        why = f"p99 {change.p99_s * 1000:.0f} ms over {change.requests} requests"
        if change.kind == "trial":
            log.warning(
                "model %s: %s is under tier %d's release point, judged on probes: half the "
                "traffic goes back to it for %g s before the tier is left",
                model.name,
                why,
                change.new,
                degrade.policy.window_s,
                extra={**_event(model.name, change), "event": "degradation_trial"},
            )
        else:
            log.warning(
                "model %s: with half the traffic back its %s is past tier %d's threshold "
                "again: the tier holds, the next try in %g s",
                model.name,
                why,
                change.new,
                degrade.dwell_s,
                extra={**_event(model.name, change), "event": "degradation_trial_failed"},
            )

    def _check_fallback(self, model: Model, degrade: Degradation, tier: int) -> None:
        """A tier that relies on the fallback model says so when it is not there to rely on."""
        name = degrade.policy.fallback_model
        if not name:
            return
        fallback = self._registry.models.get(name)
        if fallback is None or fallback.default_version() is None:
            log.warning(
                "model %s: degradation tier %d sends requests to its fallback model '%s', which "
                "is not loaded and ready: the model keeps answering them itself (its circuit, if "
                "held open, refuses them); load '%s' before it is needed",
                model.name,
                tier,
                name,
                name,
                extra={"model": model.name, "event": "degradation_fallback_unavailable"},
            )

    def _rollback(self, model: Model, degrade: Degradation, change: TierChange, now: float) -> None:
        """Roll back through the routing's own rollback: a canary taking traffic whose p99 is
        past the tier's threshold loses its weight; with no canary, a promote made within
        degrade_rollback_within_s is undone when the promoted version is the slow one."""
        router, name = model.router, model.name
        threshold = degrade.policy.tiers[change.new - 1].p99_s
        trigger = f"p99 {change.p99_s * 1000:.0f} ms over {change.requests} requests"
        stable = router.stable
        canaries = [v for v, w in router.weights.items() if w > 0 and v != stable]
        if canaries:
            slow = []
            for version in canaries:
                p99, n = degrade.version_p99(version, now)
                if n and p99 > threshold:
                    slow.append((version, p99, n))
            if not slow:
                log.warning(
                    "model %s: degradation tier %d (%s): its canaries (version %s) are not the "
                    "slow ones; nothing rolled back",
                    name,
                    change.new,
                    trigger,
                    ", ".join(canaries),
                    extra=_event(name, change),
                )
                return
            for version, _, _ in slow:
                router.guard_rollback(version)
            self._registry.changed()
            degrade.forget([v for v, _, _ in slow])
            for version, p99, n in slow:
                log.warning(
                    "model %s: degradation tier %d rolled canary version %s back (weight -> 0): "
                    "the model's %s passed %.0f ms, the canary's p99 %.0f ms over %d requests; "
                    "weights now %s",
                    name,
                    change.new,
                    version,
                    trigger,
                    threshold * 1000,
                    p99 * 1000,
                    n,
                    dict(router.weights),
                    extra={**_event(name, change), "version": version},
                )
            return
        # Only a promote, the last routing change, of the version now slow: undone through
        # the routing's rollback (the weights before it come back).
        promoted = router.promoted
        fresh = promoted is not None and now - promoted[1] <= degrade.policy.rollback_within_s
        p99, n = degrade.version_p99(stable, now) if stable else (0.0, 0)
        if not (fresh and promoted is not None and promoted[0] == stable and n and p99 > threshold):
            log.warning(
                "model %s: degradation tier %d (%s): nothing to roll back (no canary taking "
                "traffic, and no promote within %.0f s whose version is the slow one)",
                name,
                change.new,
                trigger,
                degrade.policy.rollback_within_s,
                extra=_event(name, change),
            )
            return
        try:
            weights = self._registry.rollback(name)
        except InferdError as exc:
            log.warning("model %s: degradation rollback failed: %s", name, exc.message)
            return
        if router.weights.get(stable, 0) > 0:  # the weights before it still gave it a share
            router.guard_rollback(stable)
            self._registry.changed()
            weights = dict(router.weights)
        degrade.forget([stable])
        log.warning(
            "model %s: degradation tier %d undid the promote of version %s (its p99 %.0f ms "
            "over %d requests; the model's %s passed %.0f ms); weights now %s",
            name,
            change.new,
            stable,
            p99 * 1000,
            n,
            trigger,
            threshold * 1000,
            weights,
            extra={**_event(name, change), "version": stable},
        )


def slowness(record: RequestRecord) -> float | None:
    """How slow the model was for this request, or None when the request says nothing of it.

    An answer: its duration. A request whose client left or whose deadline passed: its
    duration (a lower bound: a client's own short deadline never makes a fast model look
    slow). A request deadline-aware admission refused (400 / 429): the model's estimate of
    how long it would have taken, so clients whose deadlines are shorter than every
    threshold, who see refusals rather than slow answers, still show a slow model as slow
    (the estimate keeps being measured: DynamicBatcher._estimate_stale). Anything else: None.
    """
    if record.cache == "hit":
        return None
    if record.failure is None or record.failure in OUT_OF_TIME:
        return record.duration_ns / 1e9
    if record.refused_estimate_s:
        return record.refused_estimate_s
    return None


def _event(model: str, change: TierChange) -> dict[str, object]:
    return {
        "model": model,
        "event": "degradation_tier",
        "tier": change.new,
        "previous_tier": change.old,
        "p99_ms": round(change.p99_s * 1000, 1),
    }
