"""Logging setup: human text lines or one JSON object per line.

Structured fields travel as `extra` on a log call (`log.info("...", extra={"model": m})`):
JSON lines carry them as top-level keys, text lines append them as compact `key=value`s.
Both formats bound every message and field, and text lines escape control characters
(log_safety.py): request-derived text can neither forge a line nor flood the log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from inferd.log_safety import (
    EXCEPTION_CHARS,
    FIELD_CHARS,
    MESSAGE_CHARS,
    json_line,
    safe,
    safe_exception,
    truncated,
)

# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's coloured duplicate of the message
}
_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_TEXT_DATEFMT = "%H:%M:%S"
# The loggers configure() sets up: inferd's own, and uvicorn's when the server lets it (the
# server passes log_config=None to uvicorn; otherwise uvicorn installs its own handlers).
_LOGGERS = ("inferd", "uvicorn")


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call passed in `extra`."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


def _json_default(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if tolist is not None:
        return tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp (ISO-8601 UTC, ms), level, logger, message, the
    `extra` fields, and `exception`/`stack` as strings when present."""

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")  # the last second formatted, and its text

    def _timestamp(self, created: float) -> str:
        second = int(created)
        cached, prefix = self._second
        if second != cached:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, prefix)
        return f"{prefix}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "timestamp": self._timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": truncated(record.getMessage(), MESSAGE_CHARS),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in doc:
                doc[key] = _bounded(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = truncated(record.exc_text, EXCEPTION_CHARS)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        text = json.dumps(doc, default=_json_default, ensure_ascii=False, separators=(",", ":"))
        return json_line(text)


def _bounded(value: Any) -> Any:
    """A JSON field's value with its text bounded (JSON escapes controls by itself)."""
    if isinstance(value, str):
        return truncated(value, FIELD_CHARS)
    if isinstance(value, int | float | bool) or value is None:
        return value
    text = json.dumps(value, default=_json_default, separators=(",", ":"))
    # A structure (the inputs' shapes) is kept as is unless its text is too long.
    return value if len(text) <= FIELD_CHARS * 4 else truncated(text, FIELD_CHARS * 4)


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        text = truncated(value, FIELD_CHARS)
        if text and text.isprintable() and " " not in text and '"' not in text:
            return text
        return json.dumps(text)  # quoted, controls escaped (and non-ASCII, as \uXXXX)
    if isinstance(value, int | float | bool):
        return str(value)
    return truncated(
        json.dumps(value, default=_json_default, separators=(",", ":")), FIELD_CHARS * 4
    )


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple | dict) and not value)


class TextFormatter(logging.Formatter):
    """The human format; `extra` fields follow the message as ` key=value` (empty ones
    are left out)."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT, _TEXT_DATEFMT)

    def format(self, record: logging.LogRecord) -> str:
        # logging.Formatter.format, with the message and the traceback made safe.
        record.message = safe(record.getMessage(), MESSAGE_CHARS)
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n    {safe_exception(record.exc_text)}"
        if record.stack_info:
            line = f"{line}\n    {safe_exception(self.formatStack(record.stack_info))}"
        return line

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = super().formatMessage(record)
        parts = [
            f"{key}={_text_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not _is_empty(value)
        ]
        return f"{line} {' '.join(parts)}" if parts else line


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {fmt!r}: 'text' or 'json'")


class _WorkerField(logging.Filter):
    """Stamps every line of a `--workers N` worker process with its index (`worker=1` in
    text, `"worker": 1` in JSON; `worker=engine` for the engine of `--engine`): N processes
    write to one terminal or file."""

    def __init__(self, worker: int | str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = self.worker
        return True


class Severities(logging.Filter):
    """Which severities are written, each on or off (Triton's log_info, log_warning,
    log_error and log_verbose_level, changed at run time through the logging API). A
    threshold (`--log-level`) cannot say "errors but no warnings": this filter, on the
    handler, can. DEBUG lines are inferd's verbose level 1."""

    def __init__(self, info: bool, warning: bool, error: bool, verbose: int) -> None:
        super().__init__()
        self.info, self.warning, self.error, self.verbose = info, warning, error, verbose

    @classmethod
    def from_level(cls, level: str | int) -> Severities:
        """What a threshold (`--log-level`'s name, or a logging level number) writes."""
        number = logging.getLevelName(level.upper()) if isinstance(level, str) else level
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}")
        return cls(
            info=number <= logging.INFO,
            warning=number <= logging.WARNING,
            error=number <= logging.ERROR,
            verbose=1 if number <= logging.DEBUG else 0,
        )

    def lowest_level(self) -> int:
        """The least severe level any line is written at: the loggers' threshold, so that
        disabled lines cost one comparison, as with a plain --log-level."""
        for on, level in (
            (self.verbose > 0, logging.DEBUG),
            (self.info, logging.INFO),
            (self.warning, logging.WARNING),
            (self.error, logging.ERROR),
        ):
            if on:
                return level
        return logging.CRITICAL + 1

    def is_threshold(self) -> bool:
        """Whether the enabled severities are exactly those at or above one level."""
        return self == Severities.from_level(self.lowest_level())

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Severities):
            return NotImplemented
        return (self.info, self.warning, self.error, self.verbose > 0) == (
            other.info,
            other.warning,
            other.error,
            other.verbose > 0,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable


# Loggers whose threshold follows the severities: inferd's, and uvicorn's (uvicorn sets
# levels on its children too, so they are set here as well).
_LEVEL_LOGGERS = (*_LOGGERS, "uvicorn.error", "uvicorn.asgi")


@dataclass
class _Setup:
    """What `configure` installed, for the logging API to change at run time."""

    handler: logging.Handler
    severities: Severities
    format: str


_setup: _Setup | None = None


def configure(level: str, fmt: str = "text", worker: int | str | None = None) -> None:
    global _setup
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    if worker is not None:
        # On the handler, not the loggers: a logger's filters skip its children's records.
        handler.addFilter(_WorkerField(worker))
    severities = Severities.from_level(level)
    handler.addFilter(severities)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    _setup = _Setup(handler, severities, fmt)
    _set_thresholds(severities.lowest_level())


def _set_thresholds(level: int) -> None:
    for name in _LEVEL_LOGGERS:
        logging.getLogger(name).setLevel(level)


def is_configured() -> bool:
    """Whether `configure` set up the logs (the `inferd` command), rather than a program
    that embeds inferd (or a test) owning the handlers."""
    return _setup is not None


def current() -> tuple[Severities, str]:
    """The severities written and the format. Without `configure`, read from the inferd
    logger's threshold; the format is then the host program's, reported as "text"."""
    if _setup is not None:
        s = _setup.severities
        return Severities(s.info, s.warning, s.error, s.verbose), _setup.format
    return Severities.from_level(logging.getLogger("inferd").getEffectiveLevel()), "text"


def apply(severities: Severities, fmt: str) -> None:
    """Write `severities` from now on, as `fmt`. Without `configure`, only thresholds
    exist: callers check `is_threshold()` and the format first (log_settings does)."""
    if _setup is not None:
        installed = _setup.severities
        installed.info, installed.warning = severities.info, severities.warning
        installed.error, installed.verbose = severities.error, severities.verbose
        if fmt != _setup.format:
            _setup.handler.setFormatter(formatter(fmt))
            _setup.format = fmt
    _set_thresholds(severities.lowest_level())
