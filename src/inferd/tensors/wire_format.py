"""What the two tensor codecs share (JSON and binary: protocol/http/rest_codec.py; protobuf:
protocol/grpc/protobuf_codec.py): declared shapes checked before anything is built from them,
Triton's shared-memory tensor parameters, and BYTES elements (Triton's length-prefixed
serialisation), bounded."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferd.datatypes import V2_TO_WIRE
from inferd.errors import invalid
from inferd.limits import DEFAULT_LIMITS
from inferd.types import Array, SharedMemoryRef, Tensor, element_count

BYTES_LENGTH = struct.Struct("<I")  # the length before each BYTES element

# A declared shape is checked before anything is built from it: numpy cannot represent more
# dimensions, or extents whose product (zeros aside) overflows its sizes, even for empty data.
MAX_NDIM = 32
MAX_EXTENT = 2**56  # product of the non-zero dims; far above any element limit
MAX_BYTES_ELEMENTS = DEFAULT_LIMITS.max_bytes_elements  # the server's --max-bytes-elements default


def declared_count(shape: tuple[int, ...], where: str) -> int:
    """The element count of a client's declared shape, once it is representable."""
    if len(shape) > MAX_NDIM:
        raise invalid(f"{where}: shape has {len(shape)} dimensions; at most {MAX_NDIM} allowed")
    count = element_count(shape)
    if 0 < count <= MAX_EXTENT:
        return count  # the usual case: no zero dims, and the product in range
    extent = 1
    for d in shape:
        extent *= max(d, 1)
        if extent > MAX_EXTENT:
            raise invalid(f"{where}: shape {list(shape)} is too large")
    return count


# Triton's shared-memory tensor parameters, on an input or a requested output: the codecs
# parse them into a `SharedMemoryRef`; the core (inferd/dataplane/shm_regions.py) resolves it.
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"

# The data of a tensor whose bytes are in shared memory: an input's until the core resolves
# it (nothing reads it before), a response output's for good (encoders send no data).
NO_DATA: Array = np.empty(0, dtype=np.uint8)
NO_DATA.flags.writeable = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def shared_memory_ref(params: Mapping[str, Any], where: str) -> SharedMemoryRef | None:
    """The region a tensor's parameters name, or None; raises naming the bad parameter."""
    region = params.get(REGION)
    if region is None:
        if BYTE_SIZE in params or OFFSET in params:
            raise invalid(f"{where}: {BYTE_SIZE} and {OFFSET} need {REGION}")
        return None
    if not isinstance(region, str) or not region:
        raise invalid(f"{where}: {REGION} must be a non-empty string")
    size = params.get(BYTE_SIZE)
    if size is None:
        raise invalid(f"{where}: {REGION} '{region}' needs {BYTE_SIZE}")
    if not _is_int(size) or size < 0:
        raise invalid(f"{where}: {BYTE_SIZE} must be an integer >= 0, got {size!r}")
    offset = params.get(OFFSET, 0)
    if not _is_int(offset) or offset < 0:
        raise invalid(f"{where}: {OFFSET} must be an integer >= 0, got {offset!r}")
    return SharedMemoryRef(region, size, offset)


def check_requested_once(name: str, seen: set[str]) -> None:
    """Refused here already (the core checks again): 100,000 copies of one output name
    would otherwise each become an object, before the model is even asked."""
    if name in seen:
        raise invalid(f"output '{name}' is requested more than once")
    seen.add(name)


_FILL_CHUNK = 1 << 16  # elements per copy into a BYTES array (a codec thread yields between)


def check_bytes_count(count: int, limit: int, where: str) -> None:
    """A BYTES tensor's elements are walked one by one (and each becomes a Python object):
    their number is bounded before any of that starts."""
    if count > limit:
        raise invalid(
            f"{where}: {count} BYTES elements, more than the limit of {limit} per tensor "
            "(--max-bytes-elements)"
        )


def decode_bytes_elements(
    chunk: memoryview | bytes, count: int, where: str, max_elements: int = MAX_BYTES_ELEMENTS
) -> Array:
    """Triton's BYTES serialisation: each element a 4-byte little-endian length, then bytes.

    Nothing is allocated from the client's `count`: each element takes at least its 4-byte
    length, so a count the data cannot hold fails before the walk, as does one past the
    configured limit.
    """
    if count * 4 > len(chunk):
        raise invalid(
            f"{where}: BYTES data of {len(chunk)} bytes cannot hold {count} elements "
            "(each takes at least 4 bytes)"
        )
    check_bytes_count(count, max_elements, where)
    buf = bytes(chunk)
    pos, end = 0, len(buf)
    items: list[bytes] = []
    for k in range(count):
        if pos + 4 > end:
            raise invalid(f"{where}: BYTES data ends after {k} of {count} elements")
        (n,) = BYTES_LENGTH.unpack_from(buf, pos)
        pos += 4
        if pos + n > end:
            raise invalid(f"{where}: BYTES element {k} claims {n} bytes past the data's end")
        items.append(buf[pos : pos + n])
        pos += n
    if pos != end:
        raise invalid(f"{where}: BYTES data holds {end - pos} bytes past its {count} elements")
    out = np.empty(count, dtype=object)
    for i in range(0, count, _FILL_CHUNK):  # one C call of 16 M would hold the GIL 0.5 s
        out[i : i + _FILL_CHUNK] = items[i : i + _FILL_CHUNK]
    return out


def as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return str(value).encode("utf-8")


def to_binary(tensor: Tensor) -> bytes | memoryview:
    """A tensor as Triton's binary extension (and shared memory) carries it: BYTES elements
    each after their length, others as their raw little-endian elements."""
    if tensor.datatype == "BYTES":
        parts = []
        for v in tensor.data.reshape(-1):
            b = as_bytes(v)
            parts.append(BYTES_LENGTH.pack(len(b)))
            parts.append(b)
        return b"".join(parts)
    array = np.ascontiguousarray(tensor.data, dtype=V2_TO_WIRE[tensor.datatype]).reshape(-1)
    # A view as bytes, not a copy; through uint8 since the buffer protocol cannot describe
    # bfloat16 elements.
    return memoryview(array.view(np.uint8))  # type: ignore[arg-type]
