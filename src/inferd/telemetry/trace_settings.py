"""Which requests are traced: Triton's trace settings, mapped onto inferd's OTLP spans.

Triton's trace extension (`GET/POST /v2[/models/<m>]/trace/setting`, gRPC TraceSetting)
names six settings; inferd has three of them, and says so:

- `trace_level`: ["TIMESTAMPS"] exports a request's span tree, ["OFF"] exports nothing.
  "TENSORS" is refused: spans carry timings and sizes, never tensor data.
- `trace_rate`: one request in N is traced (the 1st, the N+1-th, ...; counting restarts
  when the rate is set). Default 1: every request.
- `trace_count`: how many more traces to export; -1 (the default) for no limit.
- `trace_mode`: "opentelemetry", the only mode; anything else is refused.
- `trace_file`, `log_frequency`: refused. Spans go to the OTLP endpoint given at start
  (`--trace-otlp-endpoint`), never to a file a client names.

A model may override any of level, rate and count (`/v2/models/<m>/trace/setting`); a
`null` value (over gRPC: a setting with no values) drops the override, and the global value
applies again. Its requests are then counted in the scope whose rate (or count) applies:
the model's own, or the global one shared by every model without an override, as Triton.

A client's `traceparent` whose sampled flag is off still exports nothing: a request must be
chosen by these settings and not unsampled by its caller. Without `--trace-otlp-endpoint`
there is nothing to export, so every change is refused (400, naming the option to set).

Everything here runs on the event loop (the API and the TraceSink both do): no locks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from inferd.errors import invalid

OFF = "OFF"
TIMESTAMPS = "TIMESTAMPS"
MODE = "opentelemetry"
UNLIMITED = -1
_REFUSED = {
    "trace_file": "inferd exports spans to the OTLP endpoint given at start "
    "(--trace-otlp-endpoint), never to a file named by a client",
    "log_frequency": "it sets how often Triton writes trace files; inferd writes none "
    "(spans are exported over OTLP in batches)",
}
SETTINGS = ("trace_level", "trace_rate", "trace_count", "trace_mode", *_REFUSED)


@dataclass(slots=True)
class Scope:
    """One scope's values (the global one, or a model's); None: the global value applies.
    `seen` counts the requests this scope's rate has looked at."""

    level: str | None = None
    rate: int | None = None
    count: int | None = None
    seen: int = 0


def _level(value: Any) -> str:
    levels = [value] if isinstance(value, str) else value
    if not isinstance(levels, list) or not levels or not all(isinstance(v, str) for v in levels):
        raise invalid(
            "trace setting 'trace_level' must be a list of levels: [\"TIMESTAMPS\"] or "
            '["OFF"] (null drops a model\'s own level)'
        )
    wanted = set(levels)
    if "TENSORS" in wanted:
        raise invalid(
            "trace setting 'trace_level': TENSORS is not supported; inferd's spans carry "
            "timings and sizes, never tensor data (use TIMESTAMPS)"
        )
    unknown = wanted - {OFF, TIMESTAMPS}
    if unknown:
        raise invalid(
            f"trace setting 'trace_level': unknown level {sorted(unknown)[0]!r}; "
            "expected TIMESTAMPS or OFF"
        )
    if wanted == {OFF, TIMESTAMPS}:
        raise invalid("trace setting 'trace_level': OFF must be the only level given")
    return OFF if OFF in wanted else TIMESTAMPS


def _integer(key: str, value: Any, lowest: int, meaning: str) -> int:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]  # gRPC: every value travels as a list of strings
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    if number is None or number < lowest or number > 2**31 - 1:
        raise invalid(
            f"trace setting '{key}' must be an integer from {lowest} to 2147483647 "
            f"({meaning}), got {value!r}"
        )
    return number


def _mode(value: Any) -> None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value != MODE:
        raise invalid(f"trace setting 'trace_mode': inferd traces with {MODE} only, got {value!r}")


class TraceSettings:
    def __init__(self, exporting: bool) -> None:
        """`exporting`: a span exporter exists (`--trace-otlp-endpoint` was given)."""
        self.exporting = exporting
        self._default = Scope(TIMESTAMPS if exporting else OFF, 1, UNLIMITED)
        self.global_scope = Scope(self._default.level, self._default.rate, self._default.count)
        self.models: dict[str, Scope] = {}

    # -- the API ------------------------------------------------------------------------

    def view(self, model: str = "") -> dict[str, Any]:
        """The settings in force for `model` (or globally), in Triton's JSON form."""
        level, rate, count = self._effective(model)
        return {
            "trace_level": [level],
            "trace_rate": str(rate),
            "trace_count": str(count),
            "trace_mode": MODE,
        }

    def update(self, model: str, changes: dict[str, Any]) -> None:
        """Apply `changes` (setting -> value; None drops a model's own value, or resets a
        global one to its default) to `model`'s scope, or the global one for "". All of
        them or none: every value is checked first. Raises a 400 naming the setting."""
        if not changes:
            return
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in SETTINGS:
                raise invalid(
                    f"unknown trace setting '{key}'; inferd has {', '.join(SETTINGS[:4])}"
                )
            if key in _REFUSED:
                raise invalid(f"trace setting '{key}' cannot be set: {_REFUSED[key]}")
            if value is None or value == []:
                parsed[key] = None
            elif key == "trace_level":
                parsed[key] = _level(value)
            elif key == "trace_rate":
                parsed[key] = _integer(key, value, 1, "trace one request in this many")
            elif key == "trace_count":
                parsed[key] = _integer(key, value, UNLIMITED, "traces left; -1: no limit")
            else:
                _mode(value)
        if not self.exporting:
            raise invalid(
                f"trace setting '{next(iter(changes))}' cannot be set: tracing is off; start "
                "inferd with --trace-otlp-endpoint URL to export spans"
            )
        scope = self.models.setdefault(model, Scope()) if model else self.global_scope
        for key, field in (
            ("trace_level", "level"),
            ("trace_rate", "rate"),
            ("trace_count", "count"),
        ):
            if key not in parsed:
                continue
            value = parsed[key]
            if value is None and not model:
                value = getattr(self._default, field)
            setattr(scope, field, value)
            if field == "rate":
                scope.seen = 0  # one in N from now on, starting with the next request
        if model and all(getattr(scope, f.name) is None for f in fields(Scope) if f.name != "seen"):
            del self.models[model]  # every value dropped: the model follows the global ones

    # -- the request path (TraceSink) -----------------------------------------------------

    def admit(self, model: str) -> Scope | None:
        """Whether `model`'s next request is traced; if so, the scope whose trace_count it
        spends (hand it to `spend` once a span was actually recorded)."""
        own = self.models.get(model) if model else None
        g = self.global_scope
        if own is None:  # the common case: no override
            level, rate_scope, count_scope = g.level, g, g
        else:
            level = own.level if own.level is not None else g.level
            rate_scope = own if own.rate is not None else g
            count_scope = own if own.count is not None else g
        if level == OFF or count_scope.count == 0:
            return None
        rate = rate_scope.rate or 1
        turn = rate_scope.seen
        rate_scope.seen = turn + 1
        return count_scope if turn % rate == 0 else None

    @staticmethod
    def spend(scope: Scope) -> None:
        if scope.count is not None and scope.count > 0:
            scope.count -= 1

    def _effective(self, model: str) -> tuple[str, int, int]:
        g = self.global_scope
        own = self.models.get(model) if model else None
        values = []
        for field in ("level", "rate", "count"):
            value = getattr(own, field) if own is not None else None
            values.append(value if value is not None else getattr(g, field))
        return values[0], values[1], values[2]
