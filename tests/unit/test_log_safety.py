"""Log lines that request-derived text can neither forge nor flood (log_safety.py, log.py),
and the model error text clients are sent (protocol/error_text.py)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from inferd.errors import ErrorKind, InferdError, invalid
from inferd.log import JsonFormatter, TextFormatter
from inferd.log_safety import FIELD_CHARS, MESSAGE_CHARS, escaped, truncated
from inferd.protocol import error_text
from inferd.protocol.error_text import MODEL_ERROR_CHARS, client_message, sanitised_model_text

FORGED = "nope\n12:00:00 ERROR   inferd.server.build: forged\r\x1b[2J\x00\x7f\x85\u2028end"


def _record(message: str, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("inferd.test")
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, message, (), None, extra=extra
    )


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, spaces and é", "plain text, spaces and é"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x1b[31mred\x00\x7f", "\\x1b[31mred\\x00\\x7f"),
        ("c1\x85\x9b", "c1\\x85\\x9b"),
        ("sep\u2028\u2029", "sep\\u2028\\u2029"),
    ],
)
def test_controls_are_escaped(raw: str, shown: str) -> None:
    assert escaped(raw) == shown


def test_truncated_says_how_much_was_cut() -> None:
    assert truncated("abc", 3) == "abc"
    assert truncated("x" * 1000, 10) == "x" * 10 + "...[990 more chars]"


def test_a_text_line_stays_one_line_whatever_the_message_and_fields() -> None:
    record = _record(f"infer {FORGED} failed", model=FORGED, request_id="\x1b]0;title\x07")
    line = TextFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x85" not in line
    assert "\u2028" not in line and "\x7f" not in line and "\x00" not in line
    assert "nope\\n12:00:00 ERROR" in line  # visible, escaped
    assert 'model="nope\\n12:00:00' in line  # a field: quoted, JSON-escaped


def test_a_text_line_is_bounded() -> None:
    record = _record("e" * (4 << 20), model="m" * (4 << 20), inputs=[{"name": "n" * 10_000}])
    line = TextFormatter().format(record)
    assert len(line) < MESSAGE_CHARS + 8 * FIELD_CHARS
    assert f"...[{(4 << 20) - MESSAGE_CHARS} more chars]" in line


def test_a_traceback_cannot_forge_lines() -> None:
    try:
        raise ValueError("boom\n12:00:00 ERROR   inferd.server.build: forged\x1b[0m")
    except ValueError:
        record = _record("unhandled")
        record.exc_info = sys.exc_info()
    text = TextFormatter().format(record)
    first, *rest = text.split("\n")
    assert first.endswith("unhandled")
    assert rest and all(line.startswith("    ") for line in rest), text
    assert "\x1b" not in text and "ValueError: boom" in text


def test_json_lines_are_bounded_and_one_line() -> None:
    line = JsonFormatter().format(_record(FORGED + "e" * (1 << 20), model="m" * (1 << 20)))
    assert "\n" not in line and len(line) < MESSAGE_CHARS + 4 * FIELD_CHARS
    assert len(line.splitlines()) == 1  # no raw U+2028, U+0085 (nor DEL) either
    doc = json.loads(line)
    assert doc["message"].startswith(FORGED) and doc["model"].endswith("more chars]")


MODEL_TEXT = (
    "model 'leaky': cannot read /srv/models/leaky/1/weights.bin: denied\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/models/leaky/1/model.py", line 7, in predict\n'
    "OSError: [Errno 13] C:\\models\\leaky\\weights.bin " + "z" * 5000
)


def test_model_error_text_loses_paths_traceback_and_length() -> None:
    text = sanitised_model_text(MODEL_TEXT)
    assert "\n" not in text and "/srv" not in text and "C:\\" not in text
    assert text.startswith("model 'leaky': cannot read <path>/weights.bin: denied OSError:")
    assert len(text) <= MODEL_ERROR_CHARS + 30 and text.endswith("more chars]")
    assert "Traceback" not in text and "model.py" not in text


def test_client_message_sanitises_only_model_errors_unless_verbose() -> None:
    model = InferdError(ErrorKind.MODEL_ERROR, MODEL_TEXT)
    client = invalid("input 'IN': unknown datatype '/a/b/c'")
    assert "/srv" not in client_message(model)
    assert client_message(client) == client.message  # inferd's own text, short: as is
    assert client_message(invalid("q" * 10_000)).endswith("more chars]")
    error_text.set_verbose(True)
    try:
        assert client_message(model) == MODEL_TEXT
    finally:
        error_text.set_verbose(False)
