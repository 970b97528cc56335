"""The router on its own: every change of a model's traffic split goes through its methods,
and a rollback undoes the last step forward (the servers' canary tests run the same over
the wire)."""

from __future__ import annotations

import pytest

from inferd.errors import InferdError
from inferd.reliability.routing import RollbackPolicy, Router

READY = {"1", "2", "3"}


def test_weights_need_ready_versions_and_keep_the_old_ones_for_a_rollback() -> None:
    router = Router()
    assert router.weights == {} and router.stable is None  # the default route
    with pytest.raises(InferdError, match="model 'm' version 4 is not loaded and ready"):
        router.set_weights({"4": 10, "1": 90}, READY, "m")
    assert router.weights == {}  # a refused change changes nothing
    router.set_weights({"2": 10, "1": 90}, READY, "m")
    assert router.weights == {"2": 10, "1": 90} and router.stable == "1"
    router.rollback("", "m")  # the canary's traffic goes back to the stable version
    assert router.weights == {"2": 0, "1": 90}
    router.promote("2", READY, "m")
    assert router.weights == {"2": 100}
    router.rollback("", "m")  # no canary taking traffic: the weights before the promote
    assert router.weights == {"2": 0, "1": 90}


def test_a_rollback_names_what_it_cannot_undo() -> None:
    router = Router()
    with pytest.raises(InferdError, match="model 'm' has no canary or earlier routing"):
        router.rollback("", "m")
    router.set_weights({"2": 10, "1": 90}, READY, "m")
    for version in ("1", "3"):  # the stable one, and one taking no traffic
        with pytest.raises(InferdError, match=f"version {version} is not a canary"):
            router.rollback(version, "m")
    router.rollback("2", "m")
    assert router.weights == {"2": 0, "1": 90}


def test_the_guard_rollback_is_counted_and_not_a_step_a_rollback_undoes() -> None:
    router = Router()
    router.set_weights({"3": 5, "2": 5, "1": 90}, READY, "m")
    router.guard_rollback("3")
    router.guard_rollback("3")
    assert router.weights == {"3": 0, "2": 5, "1": 90}
    assert router.rollbacks == {"3": 2}
    router.rollback("", "m")  # the remaining canary goes; the guard's step stays
    assert router.weights == {"3": 0, "2": 0, "1": 90}


def test_configure_and_clear_replace_the_weights_without_history() -> None:
    router = Router()
    policy = RollbackPolicy(enabled=True, min_requests=5)
    router.configure(policy, None)  # a config without canary_weights keeps the weights
    assert router.policy is policy and router.weights == {}
    router.configure(policy, {"2": 10, "1": 90})
    assert router.weights == {"2": 10, "1": 90}
    router.clear()
    assert router.weights == {} and router.pick(dict.fromkeys(READY), "key") is None
    with pytest.raises(InferdError, match="no canary or earlier routing"):
        router.rollback("", "m")


def test_a_routing_key_always_lands_on_the_same_version() -> None:
    router = Router()
    router.set_weights({"2": 50, "1": 50}, READY, "m")
    ready = dict.fromkeys(READY)
    picks = {key: router.pick(ready, key) for key in (f"user-{i}" for i in range(200))}
    assert set(picks.values()) == {"1", "2"}
    assert all(router.pick(ready, key) == version for key, version in picks.items())
    assert router.pick({"1": None}, "user-0") == "1"  # only ready versions are candidates


def test_forget_drops_unloaded_versions_weights_and_rollbacks() -> None:
    router = Router()
    router.set_weights({"3": 5, "2": 5, "1": 90}, READY, "m")
    router.guard_rollback("3")
    router.forget(lambda v: v == "3")  # version 3 was unloaded
    assert router.weights == {"2": 5, "1": 90} and router.rollbacks == {}
    before = router.weights
    router.forget(lambda v: False)  # nothing gone: the very same weights
    assert router.weights is before
    router.guard_rollback("2")
    router.clear()  # the model unloaded: its rollback counts go too
    assert router.rollbacks == {}
