"""Cache keys that cannot serve a wrong answer: a full canonical description of the request
and a 128-bit blake2b digest of it.

The description is an unambiguous byte encoding (type tags, length prefixes, counts) of
everything that can change the answer: model, the version actually chosen, every input's
name, datatype, shape and bytes (inputs in name order: order is irrelevant, content is not),
the requested outputs in order with all their parameters, and every request parameter but
KEY_EXEMPT_PARAMETERS, typed so 1, 1.0, "1" and True differ. Two different requests never
produce the same description, and the cache compares descriptions on every hit, so even a
digest collision misses instead of answering with another request's outputs.

Normalisation is opt-in per model (KeyOptions), changes only the key (the model still runs
on the inputs as sent), and is written into the description itself, so entries made under
one setting never answer lookups made under another.
"""

from __future__ import annotations

import hashlib
import re
import struct
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.datatypes import BF16, V2_TO_NUMPY
from inferd.types import RequestedOutput, SharedMemoryRef, Tensor

DIGEST_BYTES = 16  # 128-bit blake2b
# Request parameters that change when or whether the answer comes, never what it is.
# `inferd_degrade` (a request's opt-out of degradation tiers) never changes the answer either.
KEY_EXEMPT_PARAMETERS = frozenset({"priority", "timeout", "inferd_degrade"})
# Applied in this order. `space`: every run of whitespace one space (a tokenizer that splits
# on whitespace, as BERT's does, reads "a  b" and "a b" alike).
TEXT_NORMALIZATIONS = ("strip", "space", "lower", "nfc")
FLOAT_DATATYPES = frozenset({"FP16", "BF16", "FP32", "FP64"})
_MAGIC = b"inferd-cache-key/1\n"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


def _text(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return _U32.pack(len(data)) + data


class UncacheableRequestError(ValueError):
    """A request parameter holds a value with no canonical encoding: run it uncached."""


@dataclass(frozen=True)
class KeyOptions:
    float_decimals: int | None = None  # cache_float_decimals: round float inputs first
    text_normalize: tuple[str, ...] = ()  # cache_text_normalize: TEXT_NORMALIZATIONS
    encoded: bytes = field(init=False, repr=False, compare=False)  # in every description

    def __post_init__(self) -> None:
        if self.float_decimals is not None and not 0 <= self.float_decimals <= 15:
            raise ValueError(f"float_decimals must be 0..15, not {self.float_decimals}")
        unknown = [n for n in self.text_normalize if n not in TEXT_NORMALIZATIONS]
        if unknown:
            raise ValueError(
                f"text_normalize: unknown {', '.join(map(repr, unknown))}, "
                f"expected any of {', '.join(TEXT_NORMALIZATIONS)}"
            )
        decimals = -1 if self.float_decimals is None else self.float_decimals
        steps = ",".join(n for n in TEXT_NORMALIZATIONS if n in self.text_normalize)
        object.__setattr__(self, "encoded", b"o" + _I64.pack(decimals) + _text(steps))


@dataclass(frozen=True, slots=True)
class CacheKey:
    digest: bytes  # blake2b of `description`, 16 bytes
    description: bytes  # the full canonical description: stored, compared on every hit


def cache_key(
    model: str,
    version: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[RequestedOutput] | None,
    parameters: Mapping[str, Any],
    options: KeyOptions = KeyOptions(),  # noqa: B008 (frozen: a shared default is safe)
) -> CacheKey:
    """The key of one request (see the module doc). UncacheableRequestError for a parameter
    value that has no canonical encoding (not JSON-like, numpy scalar or array)."""
    parts: list[bytes | memoryview] = [_MAGIC, _text(model), _text(version), options.encoded]
    parts.append(_U32.pack(len(inputs)))
    for tensor in sorted(inputs, key=_name):
        _tensor(tensor, options, parts)
    if outputs is None:
        parts.append(b"-")  # every output: not the same request as an empty list
    else:
        parts.append(b"O" + _U32.pack(len(outputs)))
        for output in outputs:
            parts.append(_text(output.name))
            _value(output.parameters, parts)
            _shared_memory(output.shared_memory, parts)
    _value({k: v for k, v in parameters.items() if k not in KEY_EXEMPT_PARAMETERS}, parts)
    description = b"".join(parts)
    return CacheKey(hashlib.blake2b(description, digest_size=DIGEST_BYTES).digest(), description)


def _name(tensor: Tensor) -> str:
    return tensor.name


def _tensor(tensor: Tensor, options: KeyOptions, parts: list[bytes | memoryview]) -> None:
    shape = tuple(tensor.shape)
    parts += [
        _text(tensor.name),
        _text(tensor.datatype),
        _U32.pack(len(shape)),
        struct.pack(f">{len(shape)}q", *shape),
    ]
    if tensor.datatype == "BYTES":
        _bytes_elements(tensor.data, options.text_normalize, parts)
        return
    data = np.asarray(tensor.data)
    expected = V2_TO_NUMPY.get(tensor.datatype)
    if expected is not None and data.dtype is not expected and data.dtype != expected:
        data = data.astype(expected)  # native order, the datatype's own type: one form
    if options.float_decimals is not None and tensor.datatype in FLOAT_DATATYPES:
        data = _rounded(data, options.float_decimals)
    data = np.ascontiguousarray(data)  # a view when it already is (nearly always)
    # The array's own buffer; BF16 (an ml_dtypes type) exports none: through its bytes.
    raw = data.reshape(-1).view(np.uint8).data if data.dtype == BF16 else data.data
    parts += [_U64.pack(raw.nbytes), raw]


def _rounded(data: np.ndarray[Any, Any], decimals: int) -> np.ndarray[Any, Any]:
    work = data.astype(np.float32) if data.dtype == BF16 else data
    rounded = np.round(work, decimals)
    rounded += 0.0  # -0.0 -> 0.0: values that compare equal hash alike
    return rounded.astype(data.dtype, copy=False)


def _bytes_elements(
    data: np.ndarray[Any, Any], steps: tuple[str, ...], parts: list[bytes | memoryview]
) -> None:
    flat = np.asarray(data, dtype=object).reshape(-1)
    parts.append(_U64.pack(flat.size))
    for element in flat:
        if steps:
            element = _normalized(element, steps)
        if isinstance(element, str):
            raw = element.encode("utf-8", "surrogatepass")
            parts += [b"s", _U64.pack(len(raw)), raw]
        else:
            raw = bytes(element)
            parts += [b"b", _U64.pack(len(raw)), raw]


_WHITESPACE = re.compile(r"\s+")


def _normalized(element: Any, steps: tuple[str, ...]) -> Any:
    was_bytes = isinstance(element, bytes | bytearray | memoryview)
    if was_bytes:
        try:
            text = bytes(element).decode("utf-8")
        except UnicodeDecodeError:
            return element  # not text: hashed as sent
    elif isinstance(element, str):
        text = element
    else:
        return element
    if "strip" in steps:
        text = text.strip()
    if "space" in steps:
        text = _WHITESPACE.sub(" ", text)
    if "lower" in steps:
        text = text.lower()
    if "nfc" in steps:
        text = unicodedata.normalize("NFC", text)
    return text.encode("utf-8") if was_bytes else text


def _shared_memory(ref: SharedMemoryRef | None, parts: list[bytes | memoryview]) -> None:
    if ref is None:
        parts.append(b"-")
    else:
        parts += [b"M", _text(ref.region), _I64.pack(ref.byte_size), _I64.pack(ref.offset)]


_EMPTY_MAP = b"m" + _U32.pack(0)


def _value(value: Any, parts: list[bytes | memoryview]) -> None:
    """A typed encoding: a tag, then a length or count where the value has one."""
    kind = type(value)
    if kind is str:
        parts.append(b"s" + _text(value))
    elif kind is bool:
        parts.append(b"t" if value else b"f")
    elif kind is dict:
        _mapping(value, parts)
    elif value is None:
        parts.append(b"n")
    elif isinstance(value, int):  # bool is final: `kind is bool` caught it
        parts.append(b"i" + _text(str(value)))
    elif isinstance(value, float):
        parts.append(b"d" + _F64.pack(value))
    elif isinstance(value, str):
        parts.append(b"s" + _text(value))
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        parts += [b"y", _U64.pack(len(raw)), raw]
    elif isinstance(value, list | tuple):
        parts.append(b"l" + _U32.pack(len(value)))
        for item in value:
            _value(item, parts)
    elif isinstance(value, Mapping):
        _mapping(value, parts)
    elif isinstance(value, np.generic):
        _value(value.item(), parts)
    elif isinstance(value, np.ndarray):
        parts += [b"a", _text(value.dtype.str), _U32.pack(value.ndim)]
        parts += [_I64.pack(d) for d in value.shape]
        _value(value.tolist(), parts)
    else:
        raise UncacheableRequestError(
            f"a parameter value of type {type(value).__name__} has no cache key encoding"
        )


def _mapping(value: Mapping[Any, Any], parts: list[bytes | memoryview]) -> None:
    """Entries in one order per key set, whatever the mapping's type or insertion order:
    string keys (wire parameters, the common case) in string order, any other key set
    sorted by each key's own encoding."""
    if not value:
        parts.append(_EMPTY_MAP)
        return
    parts.append(b"m" + _U32.pack(len(value)))
    if all(type(k) is str for k in value):
        for name in sorted(value):
            parts.append(b"s" + _text(name))
            _value(value[name], parts)
        return
    items = []
    for key, item in value.items():
        encoded: list[bytes | memoryview] = []
        _value(key, encoded)
        items.append((b"".join(encoded), item))
    items.sort(key=lambda pair: pair[0])
    for encoded_key, item in items:
        parts.append(encoded_key)
        _value(item, parts)
