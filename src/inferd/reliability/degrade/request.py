"""A request's say in its degradation: the request parameter `inferd_degrade: false` asks
never to be answered by a degradation tier (no fallback model, no stale cache entry): the
request waits for the model itself, or is refused (a tier's queue bound, its open circuit).
Reserved: models never see it, and it is not part of a cache key (tensors/request_parameters.py,
cache/keys.py)."""

from __future__ import annotations

from inferd.errors import invalid
from inferd.types import InferRequest

OPT_OUT_PARAMETER = "inferd_degrade"


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
