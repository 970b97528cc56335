"""Values a client sends in headers and flag parameters, parsed strictly.

`float()`, `int()` and `bool()` are lenient in ways a client should not rely on: `float("inf")`
made `inferd-timeout-ms: inf` a 500 (OverflowError), `int(" 1_0")` is 10, and `bool("no")` is
True (`binary_data: "no"` asked for binary). Here a value is what it plainly says, or the
request is a 400 / INVALID_ARGUMENT naming the header or parameter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inferd.errors import invalid

TIMEOUT_MS = "inferd-timeout-ms"  # the client's deadline for this request
MAX_TIMEOUT_MS = 2**31 - 1  # about 24.8 days: past any deadline worth keeping a request for
_DECIMAL = re.compile(r"[0-9]{1,10}(\.[0-9]{1,20})?")  # what str(float) writes, bar exponents
_DIGITS = re.compile(r"[0-9]{1,19}")

# Triton's flags: on a requested output, and (HTTP) on the request for every output.
BINARY_FLAGS = ("binary_data", "binary_data_output")


def deadline_ns(raw: str | None, start_ns: int, header: str = TIMEOUT_MS) -> int | None:
    """The perf_counter_ns deadline a timeout header in milliseconds sets, or None."""
    if raw is None:
        return None
    if not _DECIMAL.fullmatch(raw):
        raise invalid(
            f"{header} '{raw[:40]}' is not a number of milliseconds (digits, optionally with a "
            "decimal fraction)"
        )
    ms = float(raw)
    if not 0 < ms <= MAX_TIMEOUT_MS:
        raise invalid(f"{header} must be > 0 and at most {MAX_TIMEOUT_MS}, got {raw}")
    return start_ns + int(ms * 1e6)


def header_length(raw: str | None) -> int | None:
    """Inference-Header-Content-Length: a plain non-negative integer, or None if absent."""
    if raw is None:
        return None
    if not _DIGITS.fullmatch(raw):
        raise invalid(f"Inference-Header-Content-Length '{raw[:40]}' is not a plain integer")
    return int(raw)


def check_flags(params: Mapping[str, Any], where: str) -> None:
    """Binary-data flags, where given, must be booleans (JSON true/false, gRPC bool_param)."""
    for key in BINARY_FLAGS:
        value = params.get(key)
        if value is not None and type(value) is not bool:
            raise invalid(f"{where}: parameter '{key}' must be true or false, got {value!r}")
