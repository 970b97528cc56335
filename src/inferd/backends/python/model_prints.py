"""Route whatever model code prints to the log, tagged with the model (field lesson 1).

`sys.stdout`/`sys.stderr` are replaced once by a proxy. While a thread runs model code it
marks itself with the model's name; writes from a marked thread become log lines of logger
`inferd.model.<name>`, writes from any other thread pass through untouched.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

_current = threading.local()


class _ModelStream:
    def __init__(self, original: TextIO, level: int) -> None:
        self._original = original
        self._level = level

    def write(self, text: str) -> int:
        model = getattr(_current, "model", None)
        if model is None:
            return self._original.write(text)
        pending = getattr(_current, "partial", "") + text
        *lines, rest = pending.split("\n")
        _current.partial = rest
        logger = logging.getLogger(f"inferd.model.{model}")
        for line in lines:
            if line:
                logger.log(self._level, line, extra={"model": model})
        return len(text)

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._original, name)


def install() -> None:
    """Wrap the current stdout/stderr; again if something (a test runner) replaced them."""
    if not isinstance(sys.stdout, _ModelStream):
        sys.stdout = _ModelStream(sys.stdout, logging.INFO)
    if not isinstance(sys.stderr, _ModelStream):
        sys.stderr = _ModelStream(sys.stderr, logging.WARNING)


def current_model() -> str | None:
    """The model whose code the current thread is running, if any."""
    model: str | None = getattr(_current, "model", None)
    return model


@contextlib.contextmanager
def running_model(name: str) -> Iterator[None]:
    """Mark the current thread as running `name`'s code for the duration of the block."""
    install()
    _current.model = name
    try:
        yield
    finally:
        partial = getattr(_current, "partial", "")
        if partial:
            logging.getLogger(f"inferd.model.{name}").info(partial, extra={"model": name})
        _current.partial = ""
        _current.model = None
