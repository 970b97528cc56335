"""The request parameters a model sees (Triton's parameters extension).

Triton keeps some keys for itself, and its backends never see them: `sequence_id`,
`sequence_start`, `sequence_end`, `priority`, `timeout`, `headers`, every `triton_*` key, and
HTTP's `binary_data_output`; inferd keeps `inferd_degrade`, below. Everything else reaches a
Python model, as a scalar: a string, a number or a boolean (what both
protocols can carry). Checked in `ModelSignature.bind`, so a bad value is a 400 /
INVALID_ARGUMENT naming the parameter before the request is queued.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferd.errors import invalid
from inferd.types import InferRequest

# A request's say in its degradation (docs/reliability.md#degradation-tiers): false asks never
# to be answered by a degradation tier (no fallback model, no stale cache entry); the request
# waits for the model itself, or is refused (a tier's queue bound, its open circuit). Reserved:
# models never see it, and it is not part of a cache key (cache/keys.py).
OPT_OUT_PARAMETER = "inferd_degrade"

RESERVED = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
        OPT_OUT_PARAMETER,
    }
)
RESERVED_PREFIX = "triton_"


def model_parameters(parameters: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """(the parameters the model sees, the request's `timeout` in µs or 0)."""
    custom: dict[str, Any] = {}
    for key, value in parameters.items():
        if key in RESERVED or key.startswith(RESERVED_PREFIX):
            continue
        if value is None or not isinstance(value, str | int | float | bool):
            raise invalid(
                f"request parameter '{key}': a model's parameters must be a string, number "
                f"or boolean, got {'null' if value is None else type(value).__name__}"
            )
        custom[key] = value
    if OPT_OUT_PARAMETER in parameters:  # reserved, and checked for every model
        opt_out_value(parameters[OPT_OUT_PARAMETER])
    timeout = parameters.get("timeout", 0)
    # A malformed timeout is refused by the scheduler's own check (dataplane).
    timeout_us = timeout if type(timeout) is int and timeout > 0 else 0
    return custom, timeout_us


def degradation_allowed(request: InferRequest) -> bool:
    """False when the request opted out; 400 naming the parameter when it is not a bool."""
    if not request.parameters:
        return True
    return opt_out_value(request.parameters.get(OPT_OUT_PARAMETER, True))


def opt_out_value(value: object) -> bool:
    if not isinstance(value, bool):
        raise invalid(
            f"request parameter '{OPT_OUT_PARAMETER}' must be a boolean (false: never answer "
            f"this request from a degradation tier), got {value!r:.40}"
        )
    return value
