"""The text of an error as a client reads it: one function below both protocols.

A model's exception text is the model's, not the client's: it can name files on the server
(`/srv/models/m/1/model.py`), carry a traceback, or quote a megabyte of input. Sent verbatim
it tells a client where things are and lets one request amplify into a large answer. So,
unless the server runs with `--verbose-errors`, a model's error (MODEL_ERROR, INTERNAL)
reaches the client on one line, absolute paths replaced by their last component
and bounded to MODEL_ERROR_CHARS; the server log keeps the full text (escaped and bounded as
every log line is: log_safety.py). Every other error is inferd's own text, naming what was
wrong; it is only bounded (it may quote what the client sent).
"""

from __future__ import annotations

import re

from inferd.errors import ErrorKind, InferdError
from inferd.log_safety import truncated

MESSAGE_CHARS = 4096  # any error: names what was wrong, and a little of what was sent
MODEL_ERROR_CHARS = 1024  # a model's own exception text
_MODEL_KINDS = frozenset({ErrorKind.MODEL_ERROR, ErrorKind.INTERNAL})
# An absolute POSIX path of two components or more (`/a/b`, `/a/b/model.py`), and Windows
# drive paths (`C:\\a\\b`): replaced by `<path>/<last component>`.
_PATH = re.compile(r"(?<![\w.~/-])(?:/[\w.@+~-]+){2,}/?|\b[A-Za-z]:\\(?:[\w.@+~ -]+\\)*[\w.@+~-]+")
_TRACEBACK = "Traceback (most recent call last)"


def _short_path(match: re.Match[str]) -> str:
    path = match.group(0).rstrip("/\\")
    last = re.split(r"[/\\]", path)[-1]
    return f"<path>/{last}"


def sanitised_model_text(text: str) -> str:
    """A model's error text as a client may read it (see the module docstring)."""
    head, _, rest = text.partition(_TRACEBACK)
    if rest:  # a traceback pasted into the message: keep its last line, the exception
        lines = [line for line in rest.splitlines() if line.strip()]
        head = f"{head.rstrip()} {lines[-1].strip()}" if lines else head
    first = head.strip().splitlines()
    one_line = " ".join(line.strip() for line in first if line.strip())
    return truncated(_PATH.sub(_short_path, one_line), MODEL_ERROR_CHARS)


_verbose = False


def set_verbose(on: bool) -> None:
    """`--verbose-errors`: send model errors whole. Process-wide, as the log configuration
    is: the server sets it when it is built (each of `--workers N` in its own process)."""
    global _verbose
    _verbose = on


def client_message(exc: InferdError) -> str:
    """The message a client is sent for `exc` (HTTP's `{"error": ...}`, gRPC's details)."""
    if _verbose:
        return exc.message
    if exc.kind in _MODEL_KINDS:
        return sanitised_model_text(exc.message)
    return truncated(exc.message, MESSAGE_CHARS)
