"""One model's tiers in motion (reliability/degrade/controller.py), on an injected clock: up at once
past a threshold, down only under the release point and after the dwell time, no move on
too few requests, probes while every request goes away, and exact fallback shares."""

from __future__ import annotations

import pytest

from inferd.reliability.degrade.controller import Degradation, Route
from inferd.reliability.degrade.tiers import DegradePolicy, parse_tiers

TIERS = "100: fallback=50%; 200: fallback; 400: open_circuit"


def make(tiers: str = TIERS, **kwargs: float) -> Degradation:
    policy = DegradePolicy(
        tiers=parse_tiers(tiers),
        window_s=kwargs.get("window_s", 2.0),
        min_requests=int(kwargs.get("min_requests", 5)),
        release_ratio=kwargs.get("release_ratio", 0.8),
        dwell_s=kwargs.get("dwell_s", 1.0),
        probe_interval_s=kwargs.get("probe_interval_s", 0.1),
        fallback_model="light",
    )
    return Degradation("m", policy)


def feed(d: Degradation, latency_s: float, start: float, n: int, step: float = 0.01) -> float:
    """n requests of `latency_s`, `step` seconds apart from `start`; the time after them."""
    now = start
    for _ in range(n):
        d.observe("1", latency_s, now)
        now += step
    d.evaluate(now)
    return now


def test_too_few_requests_never_move_a_tier() -> None:
    d = make(min_requests=5)
    feed(d, 1.0, 0.0, 4)
    assert d.tier == 0
    feed(d, 1.0, 0.1, 1)
    assert d.tier == 3  # straight to the highest tier passed


def test_up_at_once_down_after_dwell_and_under_the_release_point() -> None:
    d = make(window_s=1.0, dwell_s=2.0, release_ratio=0.8)
    now = feed(d, 0.150, 0.0, 10)  # p99 150 ms: past 100, not 200
    assert d.tier == 1
    entered = d.entered_at
    # Under the threshold but above its release point (80 ms): held, however long.
    now = feed(d, 0.090, now + 1.0, 20, step=0.1)
    assert d.tier == 1
    # Under the release point: held until the dwell time has passed since entering.
    d2 = make(window_s=1.0, dwell_s=5.0)
    t = feed(d2, 0.150, 0.0, 10)
    t = feed(d2, 0.010, t + 1.0, 10)  # the window now holds only fast requests
    assert d2.tier == 1 and t - d2.entered_at < 5.0
    t = feed(d2, 0.010, d2.entered_at + 5.0, 10)
    assert d2.tier == 0
    assert entered == pytest.approx(0.04)  # at the 5th request: min_requests in the window
    assert d.changes == 1 and d2.changes == 2


def test_latency_hovering_at_the_threshold_does_not_flap() -> None:
    d = make(window_s=1.0, dwell_s=0.5)
    now = 0.0
    # Blocks of 130 ms and 105 ms around tier 1's 100 ms, for 60 s of requests.
    for block in range(120):
        latency = 0.130 if block % 2 == 0 else 0.105
        now = feed(d, latency, now, 10, step=0.05)
    assert d.tier == 1
    assert d.changes == 1  # entered once, never left while hovering above 80 ms
    # Without hysteresis (release at the threshold itself) the same traffic flaps.
    flappy = make(window_s=0.3, dwell_s=0.0, release_ratio=1.0)
    now = 0.0
    for block in range(40):
        latency = 0.130 if block % 2 == 0 else 0.050
        now = feed(flappy, latency, now, 10, step=0.05)
    assert flappy.changes > 10


def test_fallback_shares_are_exact() -> None:
    d = make()
    feed(d, 0.150, 0.0, 10)
    assert d.tier == 1
    routes = [d.route(1.0) for _ in range(100)]
    assert routes.count(Route.FALLBACK) == 50
    assert routes.count(Route.PRIMARY) == 50


def test_while_everything_goes_away_one_probe_at_a_time_measures_the_primary() -> None:
    d = make(probe_interval_s=0.1)
    feed(d, 0.250, 0.0, 10)
    assert d.tier == 2  # fallback=100%
    assert d.route(5.0) is Route.PROBE
    # One probe at a time: the next requests go away while it runs, however late.
    assert [d.route(5.0 + i) for i in range(3)] == [Route.FALLBACK] * 3
    d.probe_done(8.0)
    # The next one a probe interval after it answered (not after it started).
    assert d.route(8.05) is Route.FALLBACK
    assert d.route(8.11) is Route.PROBE
    d.probe_done(8.2)
    feed(d, 0.5, 9.0, 10)
    assert d.tier == 3
    assert d.route(20.0) is Route.PROBE
    assert d.route(20.0) is Route.CIRCUIT


def test_a_version_p99_and_forgetting() -> None:
    d = make(TIERS + "; 800: rollback")  # a rollback tier: versions' own windows are kept
    for i in range(10):
        d.observe("1", 0.01, i * 0.01)
        d.observe("2", 0.3, i * 0.01)
    p99, n = d.version_p99("2", 0.1)
    assert p99 == pytest.approx(0.3) and n == 10
    assert d.version_p99("3", 0.1) == (0.0, 0)
    d.forget(["2"])
    assert d.version_p99("2", 0.1) == (0.0, 0)
    d.evaluate(0.2)  # the model's window starts again: too few to move
    assert d.p99_s == pytest.approx(0.3)  # as last evaluated, before forgetting


def test_a_quick_re_entry_doubles_the_dwell_time_and_a_calm_spell_resets_it() -> None:
    d = make(window_s=0.5, dwell_s=1.0)
    now = feed(d, 0.150, 0.0, 10)  # into tier 1
    assert (d.tier, d.dwell_s) == (1, 1.0)
    # A release judged on fast answers, then the slowness straight back: a flap.
    now = feed(d, 0.010, d.entered_at + 1.0, 10)
    assert d.tier == 0
    now = feed(d, 0.150, now + 0.1, 10)
    assert (d.tier, d.damping, d.dwell_s) == (1, 1, 2.0)
    entered = d.entered_at
    now = feed(d, 0.010, entered + 1.5, 10)  # the old dwell has passed, the doubled one not
    assert d.tier == 1
    now = feed(d, 0.010, entered + 2.0, 10)
    assert d.tier == 0
    now = feed(d, 0.150, now + 0.1, 10)
    assert d.dwell_s == 4.0
    for _ in range(10):  # capped at 16x
        now = feed(d, 0.010, d.entered_at + d.dwell_s, 10)
        now = feed(d, 0.150, now + 0.1, 10)
    assert d.dwell_s == 16.0
    # Down, and a long calm spell before the next slowness: the dwell time is the policy's.
    now = feed(d, 0.010, d.entered_at + d.dwell_s, 10)
    assert d.tier == 0
    feed(d, 0.150, now + 60.0, 10)
    assert (d.tier, d.damping, d.dwell_s) == (1, 0, 1.0)


def test_with_only_probes_reaching_the_model_a_few_suffice_to_judge() -> None:
    d = make(min_requests=20, window_s=2.0)
    now = feed(d, 0.250, 0.0, 20)
    assert d.tier == 2  # fallback=100%: only probes reach the model now
    # A slow primary's probes, once the window holds nothing else: three are enough to
    # move it up (20, min_requests, would take 10 s of half-second probes in a 2 s window).
    for i in range(2):
        d.observe("1", 0.5, now + 3.0 + 0.6 * i)
    assert d.tier == 2
    d.observe("1", 0.5, now + 4.2)
    assert d.tier == 3


def test_an_all_away_tier_is_left_only_after_half_the_traffic_back_stays_fast() -> None:
    d = make(window_s=1.0, dwell_s=1.0, min_requests=5)
    now = feed(d, 0.250, 0.0, 10)
    assert d.tier == 2  # fallback=100%: only probes reach the model
    # Fast probes after the dwell time: not left yet, half the traffic goes back first.
    now = feed(d, 0.010, d.entered_at + 1.5, 5)
    assert d.tier == 2 and d.trial_since
    routes = [d.route(now) for _ in range(10)]
    assert routes.count(Route.TRIAL) == 5 and routes.count(Route.FALLBACK) == 5
    # Under that load it is slow again: the trial fails, the tier holds, the dwell doubles.
    now = feed(d, 0.250, now, 5)
    assert d.tier == 2 and not d.trial_since and d.dwell_s == 2.0
    assert d.route(now + 1.0) is Route.PROBE  # probes again
    d.probe_done(now + 1.0)
    # Fast under half the traffic for a whole window: the tier is left.
    now = feed(d, 0.010, d.entered_at + 2.0, 5)
    assert d.trial_since and d.tier == 2
    now = feed(d, 0.010, now + 0.5, 5)
    assert d.tier == 2  # the window still holds requests from before the trial
    feed(d, 0.010, d.trial_since + 1.0, 5)
    assert d.tier == 0 and not d.trial_since


def test_a_trial_that_stays_between_release_point_and_threshold_fails_after_a_window() -> None:
    d = make(window_s=1.0, dwell_s=1.0, min_requests=5)
    feed(d, 0.250, 0.0, 10)
    assert d.tier == 2
    now = feed(d, 0.010, d.entered_at + 1.5, 5)  # fast probes: a trial
    started = d.trial_since
    assert started
    # Under half the traffic: 180 ms, under tier 2's 200 ms, above its 160 ms release point.
    now = feed(d, 0.180, now, 5, step=0.05)
    assert d.trial_since == started and d.tier == 2
    feed(d, 0.180, started + 1.0, 5)
    assert d.tier == 2 and not d.trial_since and d.damping == 1  # failed: the tier holds


def test_without_a_rollback_tier_no_version_window_is_kept() -> None:
    d = make()
    d.observe("2", 0.3, 0.0)
    assert d.version_p99("2", 0.1) == (0.0, 0)


def test_an_unloaded_versions_own_window_goes() -> None:
    d = make("100: rollback", min_requests=3)
    for version in ("1", "2"):
        for i in range(3):
            d.observe(version, 0.05, i * 0.01)
    assert d.version_p99("1", 0.1)[1] == 3
    d.forget_unloaded(lambda version: version == "1")
    assert d.version_p99("1", 0.1) == (0.0, 0) and d.version_p99("2", 0.1)[1] == 3
