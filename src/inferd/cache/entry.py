"""One cached response: outputs the cache owns (read-only copies) and the key description
they answer, compared on every hit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inferd.types import Array, Tensor

BYTES_PREFIX = 4  # a BYTES element's length prefix, counted like the wire counts it
TENSOR_OVERHEAD = 64  # name, datatype, shape: about what one output adds beside its data


@dataclass(frozen=True, slots=True)
class CachedResponse:
    description: bytes
    outputs: tuple[Tensor, ...]  # arrays read-only, owned by the cache
    nbytes: int  # description + outputs: what the local tier's bound counts


def tensor_bytes(tensor: Tensor) -> int:
    if tensor.datatype != "BYTES":
        return int(tensor.data.nbytes)
    return sum(BYTES_PREFIX + len(e) for e in tensor.data.reshape(-1))


def outputs_bytes(outputs: Sequence[Tensor]) -> int:
    return sum(TENSOR_OVERHEAD + len(t.name) + tensor_bytes(t) for t in outputs)


def frozen(array: Array) -> Array:
    array.flags.writeable = False
    return array


def owned_copy(outputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """Copies the cache owns, made once at insert: never views of the caller's buffers."""
    return tuple(
        Tensor(
            t.name,
            t.datatype,
            tuple(t.shape),
            frozen(np.array(t.data, copy=True, order="C")),
            dict(t.parameters),
        )
        for t in outputs
    )


def make_entry(description: bytes, outputs: tuple[Tensor, ...]) -> CachedResponse:
    return CachedResponse(description, outputs, len(description) + outputs_bytes(outputs))


def handed_out(entry: CachedResponse) -> list[Tensor]:
    """Fresh Tensor objects over the shared read-only arrays: a caller may change its
    tensors' fields (parameters, ...) without touching the cache's."""
    return [Tensor(t.name, t.datatype, t.shape, t.data, dict(t.parameters)) for t in entry.outputs]
