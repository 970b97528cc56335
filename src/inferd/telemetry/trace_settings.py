"""Which requests are traced: Triton's trace settings, read and changed through Triton's
trace extension (`GET/POST /v2[/models/<m>]/trace/setting`, gRPC TraceSetting).

The server starts with `--trace-config` (trace_config.py); these settings are then the
ones in force, over either way of tracing (`trace_mode`, fixed at start): a Triton trace
file (`triton`, trace_file.py) or OpenTelemetry spans (`opentelemetry`, tracing.py).

- `trace_level`: ["TIMESTAMPS"] traces, ["OFF"] traces nothing. "TENSORS" is refused:
  inferd traces timings, never tensor data.
- `trace_rate`: one request in N is traced (the 1st, the N+1-th, ...; counting restarts
  when the rate is set).
- `trace_count`: how many more traces to take; -1 for no limit.
- `log_frequency` (mode triton only): the trace file is written every that many traces, as
  `<trace_file>.<n>`; 0: at shutdown, in `<trace_file>` itself.
- `trace_file` (mode triton only), `trace_mode`: read-only. The file is named at start: a
  path chosen by a client would let it write any file the server may write.

A model may override any of level, rate, count and log frequency
(`/v2/models/<m>/trace/setting`); a `null` value (over gRPC: a setting with no values)
drops the override, and the global value applies again. Its requests are then counted in
the scope whose rate (or count) applies: the model's own, or the global one shared by every
model without an override. A `null` global value returns to the value the server started
with. With nowhere to trace to (no file, no collector) every change is refused (400, naming
the options to start with), as Triton refuses a trace setting without a trace file.

Everything here runs on the event loop (the API and the sinks both do): no locks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from inferd.errors import invalid
from inferd.telemetry.trace_config import (
    MAX_INT32,
    OFF,
    OPENTELEMETRY,
    TIMESTAMPS,
    TRITON,
    UNLIMITED,
    TraceConfig,
)

SETTINGS = (
    "trace_level",
    "trace_rate",
    "trace_count",
    "log_frequency",
    "trace_file",
    "trace_mode",
)
_FIELDS = (
    ("trace_level", "level"),
    ("trace_rate", "rate"),
    ("trace_count", "count"),
    ("log_frequency", "log_frequency"),
)


@dataclass(slots=True)
class Scope:
    """One scope's values (the global one, or a model's); None: the global value applies.
    `seen` counts the requests this scope's rate has looked at."""

    level: str | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
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
            "trace setting 'trace_level': TENSORS is not supported; inferd traces timings, "
            "never tensor data (use TIMESTAMPS)"
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


def _one(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 1:
        return value[0]  # gRPC: every value travels as a list of strings
    return value


def _integer(key: str, value: Any, lowest: int, meaning: str) -> int:
    value = _one(value)
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    if number is None or number < lowest or number > MAX_INT32:
        raise invalid(
            f"trace setting '{key}' must be an integer from {lowest} to {MAX_INT32} "
            f"({meaning}), got {value!r}"
        )
    return number


class TraceSettings:
    def __init__(self, config: TraceConfig | None = None) -> None:
        """`config`: how the server traces from its start (none: it does not)."""
        self.config = config = config if config is not None else TraceConfig()
        self.mode = config.mode
        self.is_on = config.is_on
        self._default = Scope(config.level, config.rate, config.count, config.log_frequency)
        self.global_scope = Scope(config.level, config.rate, config.count, config.log_frequency)
        self.models: dict[str, Scope] = {}

    # -- the API ------------------------------------------------------------------------

    def view(self, model: str = "") -> dict[str, Any]:
        """The settings in force for `model` (or globally), in Triton's JSON form."""
        level, rate, count, log_frequency = self._effective(model)
        view: dict[str, Any] = {
            "trace_level": [level],
            "trace_rate": str(rate),
            "trace_count": str(count),
        }
        if self.mode == TRITON:
            view["log_frequency"] = str(log_frequency)
            view["trace_file"] = self.config.file
        view["trace_mode"] = self.mode
        return view

    def update(self, model: str, changes: dict[str, Any]) -> None:
        """Apply `changes` (setting -> value; None drops a model's own value, or returns a
        global one to its value at start) to `model`'s scope, or the global one for "". All
        of them or none: every value is checked first. Raises a 400 naming the setting."""
        if not changes:
            return
        parsed = {key: self._parse(key, value) for key, value in changes.items()}
        if not self.is_on:
            raise invalid(
                f"trace setting '{next(iter(changes))}' cannot be set: tracing is off; start "
                "inferd with --trace-config triton,file=PATH (a Triton trace file) or "
                "--trace-otlp-endpoint URL (OpenTelemetry spans)"
            )
        scope = self.models.setdefault(model, Scope()) if model else self.global_scope
        for key, field in _FIELDS:
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

    def _parse(self, key: str, value: Any) -> Any:
        """`value` checked for setting `key`: None for a null (or an empty gRPC list)."""
        if key not in SETTINGS:
            raise invalid(f"unknown trace setting '{key}'; inferd has {', '.join(SETTINGS)}")
        if value is None or value == []:
            return None  # (for trace_file and trace_mode: what holds already)
        if key == "trace_level":
            return _level(value)
        if key == "trace_rate":
            return _integer(key, value, 1, "trace one request in this many")
        if key == "trace_count":
            return _integer(key, value, UNLIMITED, "traces left; -1: no limit")
        if key == "log_frequency":
            if self.mode == OPENTELEMETRY:
                raise invalid(
                    "trace setting 'log_frequency' does not apply in trace mode opentelemetry: "
                    "it sets how often a trace file is written, and spans are exported over "
                    "OTLP in batches"
                )
            return _integer(key, value, 0, "traces per trace file; 0: one file at shutdown")
        if key == "trace_file":
            raise invalid(
                "trace setting 'trace_file' cannot be changed: the trace file is set at start "
                "only (--trace-config triton,file=PATH); a path chosen by a client would let "
                "it write any file the server may write"
            )
        if _one(value) != self.mode:
            raise invalid(
                "trace setting 'trace_mode' is chosen at start (--trace-config mode=...): "
                f"this server traces in mode {self.mode}, got {_one(value)!r}"
            )
        return None

    # -- the request path (the sinks) -----------------------------------------------------

    def admit(self, model: str) -> Scope | None:
        """Whether `model`'s next request is traced; if so, the scope whose trace_count it
        spends (hand it to `spend` once its trace was actually taken)."""
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

    def file_scope(self, model: str) -> tuple[str, int]:
        """Where `model`'s traces wait for the trace file: the scope whose log_frequency
        applies ("" the global one, else the model's name), and that frequency."""
        own = self.models.get(model) if model else None
        if own is not None and own.log_frequency is not None:
            return model, own.log_frequency
        return "", self.global_scope.log_frequency or 0

    def _effective(self, model: str) -> tuple[str, int, int, int]:
        g = self.global_scope
        own = self.models.get(model) if model else None
        values = []
        for _, field in _FIELDS:
            value = getattr(own, field) if own is not None else None
            values.append(value if value is not None else getattr(g, field))
        return values[0], values[1], values[2], values[3]
