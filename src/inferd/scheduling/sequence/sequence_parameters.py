"""Triton's sequence extension on the request: which sequence a request belongs to."""

from __future__ import annotations

from inferd.errors import invalid
from inferd.types import SEQUENCE_END, SEQUENCE_START, InferRequest

_SEQUENCE_FLAGS = (("sequence_start", SEQUENCE_START), ("sequence_end", SEQUENCE_END))
_UINT64_MAX = 2**64 - 1


def sequence_parameters(
    request: InferRequest, model: str, is_sequence_model: bool
) -> tuple[int | str, int]:
    """`sequence_id` (uint64 or string; 0 / "" for none), `sequence_start`, `sequence_end`
    (bools) -> (correlation id, flags). Sequence parameters sent to a model without
    `sequence_batching` are refused: they would be silently meaningless there."""
    params = request.parameters
    cid = params.get("sequence_id", 0)
    if isinstance(cid, bool) or not (
        isinstance(cid, str) or (isinstance(cid, int) and 0 <= cid <= _UINT64_MAX)
    ):
        raise invalid(
            f"request parameter 'sequence_id' must be an unsigned 64-bit integer or a string, "
            f"got {cid!r}"
        )
    flags = 0
    for key, bit in _SEQUENCE_FLAGS:
        value = params.get(key, False)
        if not isinstance(value, bool):
            raise invalid(f"request parameter '{key}' must be a boolean, got {value!r}")
        if value:
            flags |= bit
    if not is_sequence_model and (cid not in (0, "") or flags):
        used = (
            "sequence_id"
            if cid not in (0, "")
            else next(k for k, b in _SEQUENCE_FLAGS if flags & b)
        )
        raise invalid(
            f"request parameter '{used}': model '{model}' is not a sequence model (its "
            "config has no sequence_batching)"
        )
    return cid, flags
