"""The trace settings' sampling decisions and the settings API's refusals, on real objects
(the integration tests check the same against exported spans and written logs)."""

from __future__ import annotations

import pytest

from inferd.errors import ErrorKind, InferdError
from inferd.telemetry.runtime_settings import RuntimeSettings
from inferd.telemetry.trace_config import otlp
from inferd.telemetry.trace_settings import TraceSettings


def decisions(settings: TraceSettings, model: str, n: int) -> list[bool]:
    out = []
    for _ in range(n):
        scope = settings.admit(model)
        if scope is not None:
            settings.spend(scope)
        out.append(scope is not None)
    return out


def test_rate_picks_the_first_of_every_n_and_restarts_when_set() -> None:
    settings = TraceSettings(otlp("http://127.0.0.1:4318/v1/traces"))
    settings.update("", {"trace_rate": "3"})
    assert decisions(settings, "m", 7) == [True, False, False, True, False, False, True]
    settings.update("", {"trace_rate": 2})  # an integer is taken too (HTTP JSON)
    assert decisions(settings, "m", 3) == [True, False, True]


def test_count_is_spent_only_by_recorded_spans() -> None:
    settings = TraceSettings(otlp("http://127.0.0.1:4318/v1/traces"))
    settings.update("", {"trace_count": "2"})
    scope = settings.admit("m")
    assert scope is not None  # admitted, but the caller's traceparent was unsampled:
    assert settings.view()["trace_count"] == "2"  # nothing spent
    assert decisions(settings, "m", 3) == [True, True, False]
    assert settings.view()["trace_count"] == "0"


def test_a_model_override_has_its_own_count_and_falls_back_when_dropped() -> None:
    settings = TraceSettings(otlp("http://127.0.0.1:4318/v1/traces"))
    settings.update("a", {"trace_count": ["1"]})  # gRPC's form: a list of strings
    assert decisions(settings, "a", 2) == [True, False]
    assert decisions(settings, "b", 2) == [True, True]  # the global count: unlimited
    settings.update("a", {"trace_count": None})
    assert "a" not in settings.models  # nothing of its own left
    assert settings.view("a")["trace_count"] == "-1"


def test_null_resets_a_global_setting_to_its_default() -> None:
    settings = TraceSettings(otlp("http://127.0.0.1:4318/v1/traces"))
    settings.update("", {"trace_level": ["OFF"], "trace_rate": "9"})
    assert decisions(settings, "m", 2) == [False, False]
    settings.update("", {"trace_level": None, "trace_rate": []})
    assert settings.view() == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
    }


def _allowed(what: str) -> None:
    pass


@pytest.mark.parametrize("what", ["trace", "log"])
def test_changes_are_refused_with_several_workers(what: str) -> None:
    runtime = RuntimeSettings(
        _allowed, lambda name: True, TraceSettings(otlp("http://127.0.0.1:4318/v1/traces"))
    )
    runtime.workers = 2
    with pytest.raises(InferdError) as info:
        if what == "trace":
            runtime.trace_settings("", {"trace_rate": "2"})
        else:
            runtime.log_settings({"log_info": True})
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "--workers 2" in info.value.message
    assert runtime.trace_settings("", None)["trace_rate"] == "1"  # reading still works
