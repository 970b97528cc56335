"""One model's degradation state: its recent latencies, the tier they put it in, and the
route each request takes while it is degraded.

The p99 is the sliding-window estimator the canary guard and the circuit use, over the
end-to-end durations of the requests the model itself served: successes, and requests that
timed out or whose client gave up waiting (a slow model's worst requests, which a p99 of
successes alone would hide). Cache hits, refusals and bad requests say nothing of the
model's speed and are left out.

Moving up is immediate: the p99 past a tier's threshold puts the model in the highest tier
it passes. Moving down needs both hysteresis and time: the p99 under `release_ratio` of the
threshold, and `dwell_s` spent in the tier, so a latency hovering at a threshold enters the
tier once and stays, rather than flapping. A tier re-entered within the dwell time of
leaving it doubles the dwell time (up to 16x; a re-entry after a calm spell resets it):
leaving is judged on what reached the model in the tier (its probes, alone, answer faster
than it does under all its traffic), and a premature release must not repeat every dwell.
Until `min_requests` are in the window the tier does not move (while only probes reach the
model, PROBES_NEEDED).

While a tier sends every request away from the primary (fallback=100%, or its circuit
open), one probe at a time, `probe_interval_s` after the last one answered, still goes to
the primary: without it nothing would ever show the model recovered.

Runs on the event loop only (the request path and the telemetry sink); a metrics scrape
reads the plain attributes and `counts` through snapshots.items().
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferd.reliability.degrade.tiers import DegradePolicy, Tier
from inferd.reliability.sliding_window import SlidingWindow

SAMPLES_KEPT = 10_000  # per window: past it the window holds the latest requests
# The p99 is recomputed at most this often (a summary copies the window: at 10k requests a
# second, once per request would be the event loop's whole time).
CHECK_EVERY_S = 0.1
PROBES_NEEDED = 3  # in the window, to judge a model only probes reach
MAX_DAMPING = 4  # the dwell time doubles at most this many times (16x)


class Route(enum.Enum):
    PRIMARY = "primary"  # served as if not degraded (a share kept, or no tier)
    PROBE = "probe"  # to the primary, to measure it, while everything else goes away
    FALLBACK = "fallback"  # to fallback_model, by the tier's share
    CIRCUIT = "open_circuit"  # the tier holds the circuit open: fallback_model or 503
    TRIAL = "trial"  # to the primary: half the traffic back, before an all-away tier is left


@dataclass(frozen=True, slots=True)
class TierChange:
    old: int
    new: int
    p99_s: float
    requests: int  # in the window the p99 is of
    # "move"; or, the tier unchanged: "trial" (half the traffic goes back to the model to
    # judge it under load before the tier is left), "trial_failed" (that made it slow again)
    kind: str = "move"


class Degradation:
    """A model's tiers in motion; `Model.degrade` when its config declares tiers."""

    def __init__(self, model: str, policy: DegradePolicy) -> None:
        self.model = model
        self.policy = policy
        self.tier = 0  # 0: not degraded
        self.entered_at = 0.0  # monotonic time the current tier was entered
        self.p99_s = 0.0  # at the last evaluation with enough requests
        self.changes = 0
        # (tier, action) -> requests answered degraded that way; action: fallback, stale,
        # open_circuit (by the fallback), refused (the circuit, or the tier's queue bound)
        self.counts: dict[tuple[int, str], int] = {}
        self._window = SlidingWindow(SAMPLES_KEPT)
        self._versions: dict[str, SlidingWindow] = {}
        self._per_version = any(t.rollback for t in policy.tiers)
        self._share = 0.0  # the fallback share's running remainder: exact proportions
        self._probing = False
        self._probe_at = 0.0
        self.trial_since = 0.0  # half the traffic given back to judge leaving (0: no trial)
        self.damping = 0  # quick re-entries in a row: the dwell time doubles with each
        self._left_at = 0.0  # when the model last moved down
        self._checked_at = 0.0
        self._unchecked = 0  # recorded since the last look
        self._judged = False  # the last look had min_requests in the window

    @property
    def current(self) -> Tier | None:
        return self.policy.tiers[self.tier - 1] if self.tier else None

    def forget_unloaded(self, gone: Callable[[str], bool]) -> None:
        """Versions unloaded: their own windows (a rollback tier's) go."""
        for version in [v for v in self._versions if gone(v)]:
            del self._versions[version]

    def count(self, tier: int, action: str) -> None:
        key = (tier, action)
        self.counts[key] = self.counts.get(key, 0) + 1

    # -- measuring ------------------------------------------------------------------------

    def observe(self, version: str, latency_s: float, now: float) -> TierChange | None:
        """One request the model served and how long it took; the tier change it causes."""
        self._window.record(latency_s, True, now)
        if self._per_version:  # only a rollback tier reads a version's own p99
            window = self._versions.get(version)
            if window is None:
                window = self._versions[version] = SlidingWindow(SAMPLES_KEPT)
            window.record(latency_s, True, now)
        self._unchecked += 1
        # Time-bound; and while the last look had too few requests, as soon as there are
        # enough (a model just started, or back from idle, is judged without waiting).
        if now - self._checked_at < CHECK_EVERY_S and (
            self._judged or self._unchecked < self.policy.min_requests
        ):
            return None
        return self.evaluate(now)

    def evaluate(self, now: float) -> TierChange | None:
        self._checked_at, self._unchecked = now, 0
        policy = self.policy
        summary = self._window.summary(policy.window_s, now)
        tier = self.current
        # While everything goes away, the probes are all the window holds: a few suffice
        # (else a primary slower than window_s / min_requests could never be judged).
        needed = policy.min_requests
        if tier is not None and tier.all_away:
            needed = min(needed, PROBES_NEEDED)
        self._judged = summary.requests >= needed
        if not self._judged:
            return None  # too few to judge: the tier holds
        p99 = self.p99_s = summary.p99_s
        passed = _highest(policy.tiers, p99, 1.0)
        if passed > self.tier:
            return self._move(passed, now, summary.requests, failed_trial=bool(self.trial_since))
        held = _highest(policy.tiers, p99, policy.release_ratio)
        if self.trial_since:
            over = now - self.trial_since >= policy.window_s
            # Slow again with half the traffic back, or, a whole window of it judged, still
            # not under the release point: the tier holds.
            if passed == self.tier or (over and held == self.tier):
                self.trial_since, self.entered_at = 0.0, now
                self.damping = min(self.damping + 1, MAX_DAMPING)
                return TierChange(self.tier, self.tier, p99, summary.requests, "trial_failed")
            if not over:
                return None  # until the window holds only the trial's requests
        if held < self.tier and now - self.entered_at >= self.dwell_s:
            if tier is not None and tier.all_away and not self.trial_since:
                # Judged on lone probes so far, which answer faster than the model does
                # under its traffic: give half of it back first, and judge that.
                self.trial_since = now
                return TierChange(self.tier, self.tier, p99, summary.requests, "trial")
            return self._move(held, now, summary.requests)
        return None

    @property
    def dwell_s(self) -> float:
        """The least time in a tier before moving down: the policy's, doubled for each quick
        re-entry in a row (flap damping)."""
        return self.policy.dwell_s * float(2**self.damping)

    def version_p99(self, version: str, now: float) -> tuple[float, int]:
        """A version's p99 over the window, and how many requests it is of."""
        window = self._versions.get(version)
        if window is None:
            return 0.0, 0
        summary = window.summary(self.policy.window_s, now)
        return summary.p99_s, summary.requests

    def forget(self, versions: list[str]) -> None:
        """Traffic moved (a rollback): the model's p99 starts again from what comes next."""
        self._window.clear()
        for version in versions:
            self._versions.pop(version, None)

    def _move(self, tier: int, now: float, requests: int, failed_trial: bool = False) -> TierChange:
        change = TierChange(self.tier, tier, self.p99_s, requests)
        if tier < self.tier:
            self._left_at = now
        elif failed_trial:  # up from a trial: that release was premature too
            self.damping = min(self.damping + 1, MAX_DAMPING)
        elif self._left_at:
            # Back up soon after coming down: the release was premature (a primary's probes,
            # alone, answer faster than it does under the traffic it gets back), so the next
            # release waits twice as long; a re-entry after a calm spell starts afresh.
            quick = now - self._left_at < self.dwell_s
            self.damping = min(self.damping + 1, MAX_DAMPING) if quick else 0
        self.tier, self.entered_at = tier, now
        self.trial_since = 0.0
        self.changes += 1
        self._share = 0.0
        return change

    # -- routing --------------------------------------------------------------------------

    def route(self, now: float) -> Route:
        """Where the next request of a degraded model goes (`current` is not None)."""
        tier = self.current
        if tier is None:
            return Route.PRIMARY
        if self.trial_since:  # every other request to the model, the rest as the tier says
            self._share += 0.5
            if self._share < 1.0:
                return Route.TRIAL
            self._share -= 1.0
            return Route.CIRCUIT if tier.open_circuit else Route.FALLBACK
        if (
            tier.all_away
            and not self._probing
            and now - self._probe_at >= self.policy.probe_interval_s
        ):
            self._probing = True
            return Route.PROBE
        if tier.open_circuit:
            return Route.CIRCUIT
        if tier.fallback_share:
            self._share += tier.fallback_share
            if self._share >= 1.0 - 1e-9:
                self._share -= 1.0
                return Route.FALLBACK
        return Route.PRIMARY

    def probe_done(self, now: float) -> None:
        """The probe answered: the next one may go `probe_interval_s` from now (a slow
        primary's probes would otherwise follow each other back to back)."""
        self._probing, self._probe_at = False, now


def _highest(tiers: tuple[Tier, ...], p99_s: float, ratio: float) -> int:
    """The highest tier whose threshold (times `ratio`) the p99 is past; 0 if none."""
    passed = 0
    for tier in tiers:
        if p99_s > tier.p99_s * ratio:
            passed = tier.number
    return passed


def degradation_statistics(state: Degradation) -> dict[str, Any]:
    """The model's statistics entries' `degradation` field: its tier now, the p99 that put
    it there, and the requests each tier answered or refused, per action."""
    requests: dict[str, dict[str, int]] = {}
    for (tier, action), count in sorted(state.counts.items()):
        requests.setdefault(str(tier), {})[action] = count
    return {
        "tier": state.tier,
        "p99_ms": round(state.p99_s * 1000, 3),
        "tier_changes": state.changes,
        "dwell_s": state.dwell_s,
        "trial": bool(state.trial_since),
        "requests": requests,
    }
