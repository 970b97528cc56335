"""What a tier change does besides routing (repository/degrade_guard.py): the circuit held open and
released, a rollback only of the slow version (or none, said so), and a reload that keeps
unchanged tiers' state (repository/degrade_reload.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from inferd.events import CallContext, RequestRecord
from inferd.reliability.circuit import CircuitBreaker
from inferd.reliability.degrade.controller import Degradation, TierChange
from inferd.reliability.degrade.tiers import DegradePolicy, parse_tiers
from inferd.repository.degrade_guard import DegradationGuard, slowness
from inferd.repository.degrade_reload import configure_degradation
from inferd.repository.model_state import Model
from inferd.repository.registry import ModelRegistry


def policy(tiers: str) -> DegradePolicy:
    return DegradePolicy(tiers=parse_tiers(tiers), min_requests=3, window_s=5.0, dwell_s=0.0)


def setup(tmp_path: Path, tiers: str) -> tuple[ModelRegistry, Model, DegradationGuard]:
    registry = ModelRegistry(tmp_path)
    model = Model("m", circuit=CircuitBreaker("m"))
    configure_degradation(model, policy(tiers))
    registry.models["m"] = model
    return registry, model, DegradationGuard(registry)


def served(version: str, ms: float, failure: str | None = None, cache: str = "") -> RequestRecord:
    return RequestRecord(
        "m", version, CallContext("http"), int(ms * 1e6), failure=failure, cache=cache
    )


def test_only_requests_that_say_how_slow_the_model_is_count(tmp_path: Path) -> None:
    _, model, guard = setup(tmp_path, "100: queue=1")
    for record in (
        served("1", 500, cache="hit"),  # answered by the cache
        served("1", 500, failure="rejected"),
        served("1", 500, failure="invalid_input"),
        served("1", 500, failure="model_error"),  # the circuit breaker's business
        served("", 500),  # no version: never reached one
    ):
        guard.on_request(record)
    assert model.degrade is not None
    assert model.degrade.evaluate(time.monotonic()) is None and model.degrade.tier == 0
    for record in (served("1", 500), served("1", 500, "timeout"), served("1", 500, "cancelled")):
        guard.on_request(record)
    assert model.degrade.tier == 1


def test_an_open_circuit_tier_holds_the_circuit_and_leaving_it_releases(tmp_path: Path) -> None:
    _, model, guard = setup(tmp_path, "100: queue=1; 200: open_circuit")
    degrade = model.degrade
    assert degrade is not None
    now = time.monotonic()
    guard.apply(model, degrade, TierChange(0, 2, 0.3, 10), now)
    assert model.circuit.is_open and "degradation tier 2" in model.circuit.held
    assert not model.circuit.allow() and model.circuit.allow(probe=True)
    guard.apply(model, degrade, TierChange(2, 1, 0.15, 10), now)
    assert not model.circuit.is_open and model.circuit.allow()


def test_rollback_takes_only_a_slow_canary_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, model, guard = setup(tmp_path, "100: rollback")
    model.router.set_weights({"1": 80, "2": 20}, {"1", "2"}, "m")
    degrade = model.degrade
    assert degrade is not None
    now = time.monotonic()
    for _ in range(10):  # the stable version is the slow one, not the canary
        degrade.observe("1", 0.3, now)
        degrade.observe("2", 0.01, now)
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        guard.apply(model, degrade, TierChange(0, 1, 0.3, 20), now)
    assert dict(model.router.weights) == {"1": 80, "2": 20}
    assert "are not the slow ones; nothing rolled back" in caplog.text
    for _ in range(10):
        degrade.observe("2", 0.5, now)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        guard.apply(model, degrade, TierChange(0, 1, 0.5, 20), now)
    assert dict(model.router.weights) == {"1": 80, "2": 0}
    assert model.router.rollbacks == {"2": 1}
    assert "rolled canary version 2 back (weight -> 0)" in caplog.text
    assert "passed 100 ms" in caplog.text and "canary's p99 500 ms" in caplog.text


def test_rollback_with_no_canary_and_no_fresh_promote_does_nothing_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, model, guard = setup(tmp_path, "100: rollback")
    degrade = model.degrade
    assert degrade is not None
    now = time.monotonic()
    for _ in range(5):
        degrade.observe("1", 0.3, now)
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        guard.apply(model, degrade, TierChange(0, 1, 0.3, 5), now)
    assert "nothing to roll back" in caplog.text
    assert dict(model.router.weights) == {}


def test_a_reload_keeps_unchanged_tiers_and_resets_changed_ones(tmp_path: Path) -> None:
    _, model, guard = setup(tmp_path, "100: open_circuit")
    degrade = model.degrade
    assert isinstance(degrade, Degradation)
    for _ in range(5):
        guard.on_request(served("1", 300))
    assert degrade.tier == 1 and model.circuit.held
    configure_degradation(model, policy("100: open_circuit"))  # the same config again
    assert model.degrade is degrade and degrade.tier == 1
    configure_degradation(model, policy("150: open_circuit"))  # new tiers: from 0
    assert model.degrade is not degrade and model.degrade is not None
    assert model.degrade.tier == 0 and not model.circuit.held
    configure_degradation(model, DegradePolicy())  # tiers removed
    assert model.degrade is None


def test_rollback_undoes_only_a_promote_never_an_operators_own_rollback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry, model, guard = setup(tmp_path, "100: rollback")
    degrade = model.degrade
    assert degrade is not None
    router = model.router
    router.set_weights({"1": 90, "2": 10}, {"1", "2"}, "m")
    router.rollback("2", "m")  # the operator took the canary back by hand
    assert dict(router.weights) == {"1": 90, "2": 0}
    now = time.monotonic()
    for _ in range(5):
        degrade.observe("1", 0.3, now)  # then version 1 turns slow
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        guard.apply(model, degrade, TierChange(0, 1, 0.3, 5), now)
    assert dict(router.weights) == {"1": 90, "2": 0}  # the canary stays rolled back
    assert "nothing to roll back" in caplog.text
    # A promote of the version that turns slow is undone: the weights before it return.
    router.promote("2", {"1", "2"}, "m")
    for _ in range(5):
        degrade.observe("2", 0.3, now)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        guard.apply(model, degrade, TierChange(0, 1, 0.3, 5), now)
    assert dict(router.weights) == {"1": 90, "2": 0}
    assert "undid the promote of version 2" in caplog.text
    assert router.promoted is None  # undone once: nothing left to undo
    assert registry.models["m"] is model


def test_how_slow_each_kind_of_request_says_the_model_is() -> None:
    def record(ms: float, failure: str | None = None, **more: object) -> RequestRecord:
        r = served("1", ms, failure)
        for key, value in more.items():
            setattr(r, key, value)
        return r

    assert slowness(record(40)) == pytest.approx(0.040)
    # Out of time: the client left, the deadline passed: at least that slow, no more (a
    # client's own short deadline never makes a fast model look slow).
    assert slowness(record(40, "cancelled")) == pytest.approx(0.040)
    assert slowness(record(0.2, "timeout")) == pytest.approx(0.0002)
    assert slowness(record(900, "timeout")) == pytest.approx(0.900)
    # Refused because the model could not answer in time: the model's own estimate.
    assert slowness(record(0.1, "invalid_input", refused_estimate_s=0.6)) == 0.6
    assert slowness(record(0.1, "rejected", refused_estimate_s=0.4)) == 0.4
    for failure in ("invalid_input", "rejected", "model_error", "unavailable"):
        assert slowness(record(500, failure)) is None
    assert slowness(served("1", 500, cache="hit")) is None


def test_an_unload_forgets_the_tier_and_releases_the_hold(tmp_path: Path) -> None:
    _, model, guard = setup(tmp_path, "100: open_circuit")
    for _ in range(5):
        guard.on_request(served("1", 300))
    assert model.degrade is not None and model.degrade.tier == 1 and model.circuit.held
    configure_degradation(model, None)  # unloaded
    assert model.degrade is None and not model.circuit.held
    configure_degradation(model, policy("100: open_circuit"))  # loaded again
    assert model.degrade is not None and model.degrade.tier == 0


def test_undoing_a_promote_takes_the_slow_version_out_of_the_weights_it_restores(
    tmp_path: Path,
) -> None:
    _, model, guard = setup(tmp_path, "100: rollback")
    degrade = model.degrade
    assert degrade is not None
    router = model.router
    router.promote("1", {"1", "2"}, "m")  # from the default route: nothing to undo
    assert router.promoted is None
    router.set_weights({"1": 90, "2": 10}, {"1", "2"}, "m")
    router.promote("2", {"1", "2"}, "m")
    now = time.monotonic()
    for _ in range(5):
        degrade.observe("2", 0.3, now)
    guard.apply(model, degrade, TierChange(0, 1, 0.3, 5), now)
    assert dict(router.weights) == {"1": 90, "2": 0}  # not back to the 10% canary
