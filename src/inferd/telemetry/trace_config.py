"""`--trace-config` values parsed into the tracing the server starts with (Triton's flag,
Triton's names, Triton's defaults).

    --trace-config triton,file=/tmp/trace.json --trace-config triton,log-frequency=50
    --trace-config rate=100 --trace-config level=TIMESTAMPS --trace-config count=100
    --trace-config mode=opentelemetry --trace-config opentelemetry,url=collector:4318/v1/traces

One setting per flag, `[MODE,]SETTING=VALUE`, as Triton parses it (a value may hold commas
and `=`). Global settings: `mode` (`triton`, the default: a trace file; `opentelemetry`:
spans over OTLP/HTTP), `level` (`OFF`, the default, or `TIMESTAMPS`), `rate` (one request
in that many is traced; default 1000), `count` (traces left; default -1, no limit).
`triton,` settings: `file` (the trace file; none by default) and `log-frequency` (also
`log_frequency`: write the traces to `file.<n>` every that many; default 0, at shutdown).
`opentelemetry,` settings: `url` (default Triton's, `http://localhost:4318/v1/traces`; a URL
without a scheme is taken as http).

`--trace-otlp-endpoint URL`, inferd's own option, is short for `mode=opentelemetry`,
`opentelemetry,url=URL`, `level=TIMESTAMPS` and `rate=1`; `--trace-config` values given
beside it set level, rate and count, and may not contradict its mode or URL.

A value we cannot honour is a TraceConfigError naming the flag and the value: a setting
given twice with different values, an unknown setting or mode, a mode's setting while
tracing in the other mode, Triton's TENSORS level, a number out of range.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

TRITON = "triton"
OPENTELEMETRY = "opentelemetry"
MODES = (TRITON, OPENTELEMETRY)
OFF = "OFF"
TIMESTAMPS = "TIMESTAMPS"
UNLIMITED = -1
MAX_INT32 = 2**31 - 1
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"  # Triton's default
OTEL_MISSING = (
    "tracing in mode opentelemetry (--trace-otlp-endpoint) needs OpenTelemetry, which is not "
    "installed: pip install 'inferd[otel]'"
)


class TraceConfigError(ValueError):
    """A `--trace-config` value we cannot honour; the message names the flag and value."""


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """How the server traces from its start (the settings API may then change level, rate,
    count and log frequency; never the mode, the file or the URL)."""

    mode: str = TRITON
    level: str = OFF  # OFF or TIMESTAMPS
    rate: int = 1000  # one request in `rate` is traced
    count: int = UNLIMITED  # traces left to take; -1: no limit
    file: str = ""  # mode triton: the trace file; "": none
    log_frequency: int = 0  # mode triton: traces per `file.<n>`; 0: all in `file`
    url: str = ""  # mode opentelemetry: the OTLP/HTTP traces URL

    @property
    def is_on(self) -> bool:
        """There is somewhere to trace to: a file, or a collector."""
        return bool(self.file) if self.mode == TRITON else bool(self.url)


def otlp(url: str) -> TraceConfig:
    """What `--trace-otlp-endpoint URL` means: every request's spans exported to `url`."""
    return TraceConfig(mode=OPENTELEMETRY, level=TIMESTAMPS, rate=1, url=_with_scheme(url))


def parse_trace_config(values: Sequence[str], otlp_endpoint: str = "") -> TraceConfig:
    """The `--trace-config` values (and `--trace-otlp-endpoint`) as one TraceConfig."""
    given: dict[tuple[str, str], tuple[str, str]] = {}  # (mode, setting) -> (value, flag)
    for text in values:
        mode, setting, value = _split(text)
        key = (mode, setting)
        if key in given and given[key][0] != value:
            raise TraceConfigError(
                f"--trace-config {text}: {_name(mode, setting)} was already given as "
                f"{given[key][0]!r} (--trace-config {given[key][1]})"
            )
        given[key] = (value, text)
    config = otlp(otlp_endpoint) if otlp_endpoint else TraceConfig()
    mode_flag = given.get(("", "mode"))
    if mode_flag is not None:
        mode = _mode(*mode_flag)
        if otlp_endpoint and mode != OPENTELEMETRY:
            raise TraceConfigError(
                f"--trace-config {mode_flag[1]}: --trace-otlp-endpoint traces in mode "
                f"{OPENTELEMETRY}; give one of the two"
            )
        config = replace(config, mode=mode)
    for (mode, setting), (value, text) in given.items():
        if mode and mode != config.mode:
            raise TraceConfigError(
                f"--trace-config {text}: a setting of mode {mode}, but the trace mode is "
                f"{config.mode} (--trace-config mode={mode} to trace that way)"
            )
        if (mode, setting) == ("", "mode"):
            continue
        config = _apply(config, mode, setting, value, text, otlp_endpoint)
    if config.mode == OPENTELEMETRY and not config.url:
        config = replace(config, url=DEFAULT_OTLP_URL)
    return config


def check_trace_config(config: TraceConfig) -> None:
    """What can be checked before the server starts: the trace file's directory can be
    written, and OpenTelemetry is installed for mode opentelemetry."""
    if config.mode == TRITON and config.file:
        directory = Path(config.file).parent
        if not directory.is_dir():
            raise TraceConfigError(
                f"--trace-config triton,file={config.file}: directory {directory} does not exist"
            )
        if not os.access(directory, os.W_OK | os.X_OK):
            raise TraceConfigError(
                f"--trace-config triton,file={config.file}: directory {directory} is not "
                "writable by the server"
            )
    if config.mode == OPENTELEMETRY and importlib.util.find_spec("opentelemetry") is None:
        raise TraceConfigError(OTEL_MISSING)


def _split(text: str) -> tuple[str, str, str]:
    """`[MODE,]SETTING=VALUE` -> (mode or "", setting, value), as Triton splits it."""
    head, comma, rest = text.partition(",")
    mode, body = (head, rest) if comma and "=" not in head else ("", text)
    setting, equals, value = body.partition("=")
    if not equals or not setting or not value:
        raise TraceConfigError(
            f"--trace-config {text}: expected [MODE,]SETTING=VALUE "
            "(e.g. triton,file=/tmp/trace.json or level=TIMESTAMPS)"
        )
    if mode and mode not in MODES:
        raise TraceConfigError(
            f"--trace-config {text}: unknown trace mode {mode!r}; expected triton or opentelemetry"
        )
    return mode, setting.strip(), value.strip()


def _name(mode: str, setting: str) -> str:
    return f"{mode},{setting}" if mode else setting


def _mode(value: str, text: str) -> str:
    if value not in MODES:
        raise TraceConfigError(
            f"--trace-config {text}: unknown trace mode {value!r}; expected triton or opentelemetry"
        )
    return value


def _apply(
    config: TraceConfig, mode: str, setting: str, value: str, text: str, otlp_endpoint: str
) -> TraceConfig:
    if not mode:
        if setting == "level":
            return replace(config, level=_level(value, text))
        if setting == "rate":
            return replace(config, rate=_integer(value, text, 1, "trace one request in this many"))
        if setting == "count":
            return replace(
                config, count=_integer(value, text, UNLIMITED, "traces to take; -1: no limit")
            )
        known = "mode, level, rate, count"
    elif mode == TRITON:
        if setting == "file":
            return replace(config, file=value)
        if setting in ("log-frequency", "log_frequency"):
            frequency = _integer(value, text, 0, "traces per file; 0: all in one at shutdown")
            return replace(config, log_frequency=frequency)
        known = "file, log-frequency"
    else:
        if setting == "url":
            url = _with_scheme(value)
            if otlp_endpoint and url != config.url:
                raise TraceConfigError(
                    f"--trace-config {text}: --trace-otlp-endpoint already names the "
                    f"collector ({otlp_endpoint}); give one of the two"
                )
            return replace(config, url=url)
        if setting == "resource" or setting.startswith("bsp_"):
            raise TraceConfigError(
                f"--trace-config {text}: inferd does not take {setting} here; set the "
                "OpenTelemetry SDK's variables instead (OTEL_RESOURCE_ATTRIBUTES, "
                "OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_SCHEDULE_DELAY, "
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE)"
            )
        known = "url"
    scope = f"{mode}," if mode else ""
    raise TraceConfigError(
        f"--trace-config {text}: unknown setting {setting!r}; {scope or 'global '}settings "
        f"are {known}"
    )


def _level(level: str, text: str) -> str:
    if level == "TENSORS":
        raise TraceConfigError(
            f"--trace-config {text}: level TENSORS is not supported; inferd traces timings, "
            "never tensor data (use TIMESTAMPS)"
        )
    if level not in (OFF, TIMESTAMPS):
        raise TraceConfigError(
            f"--trace-config {text}: unknown level {level!r}; expected TIMESTAMPS or OFF"
        )
    return level


def _integer(value: str, text: str, lowest: int, meaning: str) -> int:
    number = int(value) if value.lstrip("-").isdigit() else None
    if number is None or not lowest <= number <= MAX_INT32:
        raise TraceConfigError(
            f"--trace-config {text}: expected an integer from {lowest} to {MAX_INT32} "
            f"({meaning}), got {value!r}"
        )
    return number


def _with_scheme(url: str) -> str:
    """Triton's `host:port/v1/traces` as a URL the OTLP exporter takes."""
    return url if "://" in url else f"http://{url}"
