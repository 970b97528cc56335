"""One cached response: outputs the cache owns (read-only copies) and the key description
they answer, compared on every hit.

Entries are plain tuples of strings, bytes, ints and numpy arrays (which the garbage
collector does not track), so the collector untracks them (one level of nesting per
collection that sees them: a few collections after insert), and from then on a tier of a
million entries adds nothing to a full collection's walk. Dataclass or NamedTuple entries
stay tracked for ever (CPython untracks exact tuples only): with unique inputs the tier
grew by thousands of entries a second, and every generation-2 pause with it. Hence
tuples, read by unpacking:

    CachedOutput   = (name, datatype, shape, data, parameters, shared_memory)
    CachedResponse = (description, outputs, nbytes)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.types import Array, SharedMemoryRef, Tensor

BYTES_PREFIX = 4  # a BYTES element's length prefix, counted like the wire counts it
TENSOR_OVERHEAD = 64  # name, datatype, shape: about what one output adds beside its data

# data: read-only, owned by the cache; parameters: the output tensor's, as items;
# shared_memory: where run() wrote it (such outputs are passed through, never stored).
CachedOutput = tuple[
    str, str, tuple[int, ...], Array, tuple[tuple[str, Any], ...], SharedMemoryRef | None
]
# nbytes: description + outputs, what the local tier's bound counts.
CachedResponse = tuple[bytes, tuple[CachedOutput, ...], int]


def cached_output(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    data: Array,
    parameters: tuple[tuple[str, Any], ...] = (),
    shared_memory: SharedMemoryRef | None = None,
) -> CachedOutput:
    return (name, datatype, shape, data, parameters, shared_memory)


def output_bytes(output: CachedOutput) -> int:
    _, datatype, _, data, _, _ = output
    if datatype != "BYTES":
        return int(data.nbytes)
    return sum(BYTES_PREFIX + len(e) for e in data.reshape(-1))


def outputs_bytes(outputs: Sequence[CachedOutput]) -> int:
    return sum(TENSOR_OVERHEAD + len(o[0]) + output_bytes(o) for o in outputs)


def response_bytes(outputs: Sequence[Tensor]) -> int:
    """What outputs_bytes will count for these outputs' copies, before copying them."""
    return outputs_bytes(passed_through(outputs))


def frozen(array: Array) -> Array:
    array.flags.writeable = False
    return array


def owned_copy(outputs: Sequence[Tensor]) -> tuple[CachedOutput, ...]:
    """Copies the cache owns, made once at insert: never views of the caller's buffers."""
    return tuple(
        (
            t.name,
            t.datatype,
            tuple(t.shape),
            frozen(np.array(t.data, copy=True, order="C")),
            tuple(t.parameters.items()),
            None,
        )
        for t in outputs
    )


def passed_through(outputs: Sequence[Tensor]) -> tuple[CachedOutput, ...]:
    """Outputs as run() gave them (written to shared memory: nothing to own or keep)."""
    return tuple(
        (t.name, t.datatype, t.shape, t.data, tuple(t.parameters.items()), t.shared_memory)
        for t in outputs
    )


def make_entry(description: bytes, outputs: tuple[CachedOutput, ...]) -> CachedResponse:
    return (description, outputs, len(description) + outputs_bytes(outputs))


def handed_out(entry: CachedResponse) -> list[Tensor]:
    """Fresh Tensor objects over the shared read-only arrays: a caller may change its
    tensors' fields (parameters, ...) without touching the cache's."""
    return [
        Tensor(name, datatype, shape, data, dict(parameters), shared_memory)
        for name, datatype, shape, data, parameters, shared_memory in entry[1]
    ]
