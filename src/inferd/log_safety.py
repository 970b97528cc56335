"""What keeps request-derived text from forging or flooding the log.

A model name from a URL (`%0a` decodes to a newline), a header value, a request id or an
error message quoting a client's value is written into log lines. Two rules, applied by the
formatters (log.py) to every line, so no call site has to remember them:

- **escaped**: control characters (C0, DEL, C1, and the Unicode line and paragraph
  separators, which some tools split lines on) become visible escapes (`\\n`, `\\x1b`,
  `\\u2028`), so one log call is one line, however the text was built, and a terminal shows
  no escape sequence it was sent.
- **bounded**: a message, a field or an exception's text is cut past its limit, with a marker
  saying how much was cut, so a 4 MiB request cannot write megabytes of log.
"""

from __future__ import annotations

MESSAGE_CHARS = 2048  # a line's message: room for an error naming what was wrong
FIELD_CHARS = 256  # one structured field (model, request id, error, client, ...)
EXCEPTION_CHARS = 16384  # a traceback: deep stacks fit, a megabyte exception message does not


def _escape(code: int) -> str:
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    if named is not None:
        return named
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]
_TABLE = {code: _escape(code) for code in _CONTROLS}
# Traceback text keeps its line breaks (a traceback is many lines); every other control goes.
_TABLE_KEEP_NEWLINES = {code: text for code, text in _TABLE.items() if code != 0x0A}


# JSON escapes C0 by itself; what it leaves raw (DEL, C1, U+2028/9, which str.splitlines and
# some log shippers split on) becomes a JSON escape.
_JSON_TABLE = {code: f"\\u{code:04x}" for code in _CONTROLS if code >= 0x7F}


def json_line(text: str) -> str:
    """A JSON document's text with every line-breaking character left in it escaped."""
    return text if text.isprintable() else text.translate(_JSON_TABLE)


def truncated(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with a marker naming how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more chars]"


def escaped(text: str) -> str:
    """`text` with every control character written as a visible escape."""
    if text.isprintable():  # the usual case: one C-level scan, no copy
        return text
    return text.translate(_TABLE)


def safe(text: str, limit: int) -> str:
    """Truncated to `limit`, then escaped: what a log line may carry of `text`."""
    return escaped(truncated(text, limit))


def safe_exception(text: str) -> str:
    """A traceback as text log lines: bounded, controls escaped, and every line after the
    first indented, so that no line of it (the exception's message included, which may
    quote a client) can read as a log line of its own."""
    text = truncated(text, EXCEPTION_CHARS)
    if not text.isprintable():
        text = text.translate(_TABLE_KEEP_NEWLINES)
    return text.replace("\n", "\n    ")
