"""The trace and log settings APIs: Triton's trace and logging extensions, over inferd's
tracing (`trace_settings`) and logs (`log`).

Reading is open; changing goes through the same admin gate as the repository API. Each
change is all or nothing: every value is checked before any is applied, and a setting
inferd cannot honour is a 400 naming it, never a silent no-op. Clients never name files:
`log_file` and `trace_file` are refused (current Triton refuses them over the network too).

Log settings, mapped onto inferd's logs (stderr, one handler for inferd's and uvicorn's
loggers):

- `log_info`, `log_warning`, `log_error` (booleans): whether INFO, WARNING, ERROR (and
  CRITICAL) lines are written; `log_verbose_level` (integer >= 0): DEBUG lines, inferd's
  only verbose level, are written when it is 1 or more.
- `log_format`: `text` or `json` (`--log-format`'s values; Triton's `default` reads as
  `text`; its `ISO8601` is refused).
- `log_file`: always "" (stderr); setting it is refused.

With `--workers N`, each worker is its own process with its own settings and an API call
reaches one of them: changes are refused there (set them with the command's options).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferd import log
from inferd.errors import invalid, not_found
from inferd.telemetry.trace_settings import TraceSettings

LOG_SETTINGS = (
    "log_file",
    "log_info",
    "log_warning",
    "log_error",
    "log_verbose_level",
    "log_format",
)
_FORMATS = {"text": "text", "json": "json", "default": "text"}
_MAX_UINT32 = 2**32 - 1


class RuntimeSettings:
    def __init__(
        self,
        admin: Callable[[str], None],
        model_exists: Callable[[str], bool],
        trace: TraceSettings | None = None,
        workers: int = 1,
    ) -> None:
        """`admin(what)` raises when changes are not allowed (the DataPlane's admin gate);
        `workers`: the processes of `--workers N`, whose settings changes need exactly one."""
        self._admin = admin
        self._model_exists = model_exists
        self.trace = trace if trace is not None else TraceSettings()
        self.workers = workers

    # -- trace settings --------------------------------------------------------------------

    def trace_settings(self, model: str, changes: dict[str, Any] | None) -> dict[str, Any]:
        """The trace settings of `model` ("" for the global ones), after `changes`."""
        if model and not self._model_exists(model):
            raise not_found(f"unknown model '{model}'")
        if changes:
            self._may_change("trace settings")
            self.trace.update(model, changes)
        return self.trace.view(model)

    # -- log settings ----------------------------------------------------------------------

    def log_settings(self, changes: dict[str, Any] | None) -> dict[str, Any]:
        """The log settings, after `changes`."""
        if changes:
            self._may_change("log settings")
            severities, fmt = _parse_log_changes(changes)
            log.apply(severities, fmt)
        severities, fmt = log.current()
        return {
            "log_file": "",
            "log_info": severities.info,
            "log_warning": severities.warning,
            "log_error": severities.error,
            "log_verbose_level": severities.verbose,
            "log_format": fmt,
        }

    def _may_change(self, what: str) -> None:
        self._admin(f"changing {what}")
        if self.workers > 1:
            raise invalid(
                f"{what} cannot be changed with --workers {self.workers}: a call reaches one "
                "worker process of them; set them with inferd serve's options "
                "(--log-level, --log-format, --trace-config), or add --engine (one "
                "engine for N front ends, whose settings these are)"
            )


def _parse_log_changes(changes: dict[str, Any]) -> tuple[log.Severities, str]:
    """The severities and format `changes` ask for, on top of the current ones; every
    value is checked before anything is applied. Raises a 400 naming the setting."""
    severities, fmt = log.current()
    for key, value in changes.items():
        if key not in LOG_SETTINGS:
            raise invalid(f"unknown log setting '{key}'; inferd has {', '.join(LOG_SETTINGS)}")
        if value is None:
            continue  # Triton's reading of null: leave the setting as it is
        if key == "log_file":
            raise invalid(
                "log setting 'log_file' cannot be set: inferd logs to stderr, and a client "
                "never chooses a file for the server to write (redirect stderr instead)"
            )
        if key == "log_format":
            if value not in _FORMATS:
                raise invalid(f"log setting 'log_format' must be text or json, got {value!r}")
            fmt = _FORMATS[value]
        elif key == "log_verbose_level":
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= _MAX_UINT32
            ):
                raise invalid(
                    f"log setting 'log_verbose_level' must be an integer >= 0, got {value!r}"
                )
            severities.verbose = value
        else:
            if not isinstance(value, bool):
                raise invalid(f"log setting '{key}' must be true or false, got {value!r}")
            setattr(severities, key.removeprefix("log_"), value)
    if not log.is_configured():
        # inferd runs inside another program (or a test) that owns the log handlers: only
        # the loggers' thresholds are inferd's to set.
        if fmt != log.current()[1]:
            raise invalid(
                "log setting 'log_format' cannot be changed: inferd's log handler is not "
                "installed (inferd runs embedded; the host program formats the lines)"
            )
        if not severities.is_threshold():
            raise invalid(
                "log settings 'log_info', 'log_warning', 'log_error': with inferd embedded "
                "in another program only a threshold can be set (each severity on implies "
                "the more severe ones on)"
            )
    return severities, fmt
