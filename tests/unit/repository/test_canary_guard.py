"""The canary guard forgets the outcomes of versions that are gone."""

from __future__ import annotations

from pathlib import Path

from inferd.events import CallContext, RequestRecord
from inferd.reliability.routing import RollbackPolicy
from inferd.repository.canary_guard import CanaryGuard
from inferd.repository.model_state import Model
from inferd.repository.registry import ModelRegistry


def test_an_unloaded_versions_outcomes_go(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    model = registry.models["m"] = Model("m")
    model.router.configure(RollbackPolicy(enabled=True, min_requests=100), None)
    model.router.set_weights({"2": 10, "1": 90}, {"1", "2"}, "m")
    guard = CanaryGuard(registry)
    for version in ("1", "2"):
        guard.on_request(RequestRecord("m", version, CallContext("http"), 1_000_000))
    assert set(guard._outcomes) == {("m", "1"), ("m", "2")}
    guard.forget(lambda name, version: version == "1")
    assert set(guard._outcomes) == {("m", "2")} and set(guard._unchecked) == {"m"}
    guard.forget(lambda name, version: name == "m")  # the whole model
    assert (guard._outcomes, guard._unchecked, guard._last_check) == ({}, {}, {})
