"""The compact form of a cached response in Redis: a small binary header per output (name,
datatype, shape, scalar parameters) before its raw little-endian bytes, never JSON, behind
the key description the lookup compares.

    b"IFDC" version:u8  description_len:u32 description  outputs:u16
    per output: name:u16+utf8  datatype:u8+ascii  ndim:u8 dims:i64*ndim
                parameters:u16 (name:u16+utf8 tag:1 value)*  data_len:u64 data
    BYTES data: elements:u64 (len:u32 bytes)*

Decoding makes no copy of fixed-size data: the arrays are read-only views of the value.

An entry stored with stale_s (kept past its TTL for a degraded model, docs/cache.md) is
that value behind an envelope carrying its times, wall-clock seconds (time.time(): the
replicas sharing Redis share no monotonic clock):

    b"IFDS" fresh_until:f64 keep_until:f64  <the value above>

Without stale_s there is no envelope: such values are exactly what they were before.
Unwrapping copies the inner value once (only enveloped values pay it).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.cache.entry import CachedOutput, cached_output
from inferd.datatypes import V2_TO_WIRE

MAGIC = b"IFDC\x01"
STALE_MAGIC = b"IFDS"
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_TIMES = struct.Struct("<dd")
ENVELOPE_BYTES = len(STALE_MAGIC) + _TIMES.size


class CorruptValueError(ValueError):
    """A Redis value that is not one of ours, or is damaged: a miss, counted as an error."""


class UnencodableError(ValueError):
    """An output parameter that is not a bool, int, float or str: not stored in Redis."""


def encode(description: bytes, outputs: Sequence[CachedOutput]) -> bytes:
    parts: list[bytes | memoryview] = [MAGIC, _U32.pack(len(description)), description]
    parts.append(_U16.pack(len(outputs)))
    for name_text, datatype_text, shape, array, parameters, _ in outputs:
        name = name_text.encode("utf-8")
        datatype = datatype_text.encode("ascii")
        parts += [_U16.pack(len(name)), name, _U8.pack(len(datatype)), datatype]
        parts.append(_U8.pack(len(shape)) + b"".join(_I64.pack(d) for d in shape))
        parts.append(_U16.pack(len(parameters)))
        for key, value in parameters:
            raw_key = str(key).encode("utf-8")
            parts += [_U16.pack(len(raw_key)), raw_key, _scalar(value)]
        if datatype_text == "BYTES":
            elements = [bytes(e) if not isinstance(e, str) else e.encode() for e in array.flat]
            body = b"".join(_U32.pack(len(e)) + e for e in elements)
            parts += [_U64.pack(len(body)), _U64.pack(len(elements)), body]
        else:
            data = np.ascontiguousarray(array, dtype=V2_TO_WIRE[datatype_text])
            raw = data.reshape(-1).view(np.uint8).data
            parts += [_U64.pack(raw.nbytes), raw]
    return b"".join(parts)


def wrap(value: bytes, fresh_until: float, keep_until: float) -> bytes:
    """The value behind the envelope of an entry kept past its TTL (wall-clock times)."""
    return STALE_MAGIC + _TIMES.pack(fresh_until, keep_until) + value


def unwrap(value: bytes) -> tuple[bytes, float | None, float | None]:
    """(the codec value, fresh_until, keep_until); (value, None, None) without an envelope."""
    if not value.startswith(STALE_MAGIC):
        return value, None, None
    if len(value) < ENVELOPE_BYTES:
        raise CorruptValueError("truncated stale envelope")
    fresh_until, keep_until = _TIMES.unpack_from(value, len(STALE_MAGIC))
    if not (math.isfinite(fresh_until) and math.isfinite(keep_until)):
        raise CorruptValueError("stale envelope times are not finite")
    return value[ENVELOPE_BYTES:], fresh_until, keep_until


def _scalar(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise UnencodableError(f"output parameter {value} is outside int64")
        return b"i" + _I64.pack(value)
    if isinstance(value, float):
        return b"d" + _F64.pack(value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return b"s" + _U32.pack(len(raw)) + raw
    raise UnencodableError(f"output parameter of type {type(value).__name__}")


class _Reader:
    def __init__(self, value: bytes) -> None:
        self.value = value
        self.at = 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if n < 0 or end > len(self.value):
            raise CorruptValueError(f"truncated at byte {self.at}")
        chunk = self.value[self.at : end]
        self.at = end
        return chunk

    def skip(self, n: int) -> int:
        """Step over n bytes without copying them; where they start."""
        start, end = self.at, self.at + n
        if n < 0 or end > len(self.value):
            raise CorruptValueError(f"truncated at byte {self.at}")
        self.at = end
        return start

    def unpack(self, fmt: struct.Struct) -> Any:
        return fmt.unpack(self.take(fmt.size))[0]


def answers(value: bytes, description: bytes) -> bool:
    """Whether the value is ours and answers exactly this description (no copy made)."""
    end = len(MAGIC) + _U32.size
    if len(value) < end or not value.startswith(MAGIC):
        return False
    (size,) = _U32.unpack_from(value, len(MAGIC))
    return size == len(description) and memoryview(value)[end : end + size] == description


def description_of(value: bytes) -> bytes:
    """The key description a value answers (checked before anything else is decoded)."""
    if not value.startswith(MAGIC):
        raise CorruptValueError("not an inferd cache value (bad magic)")
    reader = _Reader(value)
    reader.take(len(MAGIC))
    return reader.take(reader.unpack(_U32))


def decode(value: bytes) -> list[CachedOutput]:
    """The outputs (read `description_of` or `answers` first); CorruptValueError for
    anything malformed."""
    try:
        return _decode(value)
    except CorruptValueError:
        raise
    except (ValueError, KeyError, UnicodeDecodeError, struct.error) as exc:
        raise CorruptValueError(f"malformed value: {exc}") from None


def _decode(value: bytes) -> list[CachedOutput]:
    if not value.startswith(MAGIC):
        raise CorruptValueError("not an inferd cache value (bad magic)")
    reader = _Reader(value)
    reader.skip(len(MAGIC))
    reader.skip(reader.unpack(_U32))  # the description: compared by `answers`
    outputs = []
    for _ in range(reader.unpack(_U16)):
        name = reader.take(reader.unpack(_U16)).decode("utf-8")
        datatype = reader.take(reader.unpack(_U8)).decode("ascii")
        shape = tuple(reader.unpack(_I64) for _ in range(reader.unpack(_U8)))
        parameters = []
        for _ in range(reader.unpack(_U16)):
            key = reader.take(reader.unpack(_U16)).decode("utf-8")
            parameters.append((key, _read_scalar(reader)))
        size = reader.unpack(_U64)
        if datatype == "BYTES":
            count = reader.unpack(_U64)
            body = _Reader(reader.take(size))
            elements = [body.take(body.unpack(_U32)) for _ in range(count)]
            if body.at != size:
                raise CorruptValueError(f"output {name!r}: BYTES body has trailing bytes")
            data = np.empty(len(elements), dtype=object)
            data[:] = elements
        else:
            dtype = V2_TO_WIRE[datatype]
            if size % dtype.itemsize:
                raise CorruptValueError(f"output {name!r}: {size} bytes of {datatype}")
            offset = reader.skip(size)
            data = np.frombuffer(value, dtype=dtype, count=size // dtype.itemsize, offset=offset)
        outputs.append(cached_output(name, datatype, shape, data.reshape(shape), tuple(parameters)))
    if reader.at != len(value):
        raise CorruptValueError("trailing bytes after the last output")
    return outputs


def _read_scalar(reader: _Reader) -> Any:
    tag = reader.take(1)
    if tag in (b"t", b"f"):
        return tag == b"t"
    if tag == b"i":
        return reader.unpack(_I64)
    if tag == b"d":
        return reader.unpack(_F64)
    if tag == b"s":
        return reader.take(reader.unpack(_U32)).decode("utf-8")
    raise CorruptValueError(f"unknown parameter tag {tag!r}")
