"""The Redis value format: every datatype round-trips exactly, and no damaged or foreign
value can raise anything but CorruptValueError (which the tier counts as an error + miss)."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd.cache import redis_encoding as codec
from inferd.cache.entry import CachedOutput, cached_output
from inferd.datatypes import V2_TO_NUMPY


def sample(datatype: str, parameters: tuple[tuple[str, Any], ...] = ()) -> CachedOutput:
    if datatype == "BYTES":
        data = np.empty((2, 2), dtype=object)
        data[:] = [[b"", b"a\x00b"], [b"\xff" * 300, b"z"]]
        return cached_output("s", "BYTES", (2, 2), data, parameters)
    values = np.arange(-3, 3).reshape(2, 3) if datatype != "BOOL" else [[True, False, True]] * 2
    data = np.array(values).astype(V2_TO_NUMPY[datatype])
    return cached_output(f"out_{datatype}", datatype, (2, 3), data, parameters)


@pytest.mark.parametrize("datatype", sorted(V2_TO_NUMPY))
def test_every_datatype_round_trips(datatype):
    tensor = sample(datatype, (("flag", True), ("count", -7), ("scale", 0.5), ("label", "é")))
    value = codec.encode(b"key", [tensor])
    assert codec.description_of(value) == b"key"
    assert codec.answers(value, b"key") and not codec.answers(value, b"kez")
    (back,) = codec.decode(value)
    name, datatype, shape, data, parameters, _ = back
    assert (name, datatype, shape, parameters) == (tensor[0], tensor[1], tensor[2], tensor[4])
    assert data.shape == tensor[3].shape and data.dtype == tensor[3].dtype
    assert data.tolist() == tensor[3].tolist()


def test_several_outputs_and_none():
    tensors = [
        sample("FP32"),
        sample("BYTES"),
        cached_output("e", "INT8", (0,), np.zeros(0, np.int8)),
    ]
    back = codec.decode(codec.encode(b"", tensors))
    assert [t[0] for t in back] == [t[0] for t in tensors]
    assert codec.decode(codec.encode(b"d", [])) == []


def test_parameters_that_are_not_scalars_are_not_encodable():
    tensor = sample("FP32", (("nested", {"a": 1}),))
    with pytest.raises(codec.UnencodableError):
        codec.encode(b"", [tensor])


VALID = codec.encode(b"some key", [sample("FP64"), sample("BYTES"), sample("BF16")])


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_corrupt_value(value):
    with contextlib.suppress(codec.CorruptValueError):
        codec.description_of(value)
    with contextlib.suppress(codec.CorruptValueError):
        codec.decode(value)
    assert not codec.answers(value, b"some key") or value.startswith(codec.MAGIC)


@given(st.integers(0, len(VALID) - 1), st.integers(1, 255), st.booleans())
def test_damaged_values_decode_or_raise_corrupt_value(at, flip, truncate):
    damaged = VALID[:at] if truncate else VALID[:at] + bytes([VALID[at] ^ flip]) + VALID[at + 1 :]
    with contextlib.suppress(codec.CorruptValueError):
        codec.decode(damaged)
    if truncate:
        with pytest.raises(codec.CorruptValueError):
            codec.decode(damaged)


def test_the_stale_envelope_round_trips_and_plain_values_pass_unchanged():
    wrapped = codec.wrap(VALID, 1700000000.25, 1700000060.5)
    assert wrapped.startswith(codec.STALE_MAGIC)
    assert len(wrapped) == len(VALID) + codec.ENVELOPE_BYTES
    assert codec.unwrap(wrapped) == (VALID, 1700000000.25, 1700000060.5)
    assert codec.unwrap(VALID) == (VALID, None, None)  # stale_s 0: the format as before
    inner, _, _ = codec.unwrap(wrapped)
    assert codec.answers(inner, b"some key") and len(codec.decode(inner)) == 3


@pytest.mark.parametrize(
    "damaged",
    [
        codec.STALE_MAGIC + b"\x00" * 7,
        codec.wrap(VALID, float("nan"), 1.0),
        codec.wrap(VALID, 1.0, float("inf")),
    ],
)
def test_a_damaged_envelope_is_a_corrupt_value(damaged):
    with pytest.raises(codec.CorruptValueError):
        codec.unwrap(damaged)
