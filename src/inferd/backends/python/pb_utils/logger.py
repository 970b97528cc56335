"""`pb_utils.Logger`: model log lines go to logger `inferd.model.<name>`, like prints do."""

from __future__ import annotations

import enum
import logging

from inferd.backends.python.model_prints import current_model


class LogLevel(enum.IntEnum):
    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


class Logger:
    """Triton's model logger; `Logger.log(msg, Logger.WARNING)` or the `log_*` shortcuts."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        model = current_model()
        name = f"inferd.model.{model}" if model else "inferd.model"
        extra = {"model": model} if model else None
        logging.getLogger(name).log(int(level), message, extra=extra)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)
