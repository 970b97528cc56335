"""The Redis value format: every datatype round-trips exactly, and no damaged or foreign
value can raise anything but CorruptValueError (which the tier counts as an error + miss)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd.cache import codec
from inferd.datatypes import V2_TO_NUMPY
from inferd.types import Tensor


def sample(datatype: str) -> Tensor:
    if datatype == "BYTES":
        data = np.empty((2, 2), dtype=object)
        data[:] = [[b"", b"a\x00b"], [b"\xff" * 300, b"z"]]
        return Tensor("s", "BYTES", (2, 2), data)
    values = np.arange(-3, 3).reshape(2, 3) if datatype != "BOOL" else [[True, False, True]] * 2
    return Tensor(
        f"out_{datatype}", datatype, (2, 3), np.array(values).astype(V2_TO_NUMPY[datatype])
    )


@pytest.mark.parametrize("datatype", sorted(V2_TO_NUMPY))
def test_every_datatype_round_trips(datatype):
    tensor = sample(datatype)
    tensor.parameters.update({"flag": True, "count": -7, "scale": 0.5, "label": "é"})
    description, (back,) = codec.decode(codec.encode(b"key", [tensor]))
    assert description == b"key"
    assert (back.name, back.datatype, back.shape, back.parameters) == (
        tensor.name,
        tensor.datatype,
        tensor.shape,
        tensor.parameters,
    )
    assert back.data.shape == tensor.data.shape and back.data.dtype == tensor.data.dtype
    assert back.data.tolist() == tensor.data.tolist()


def test_several_outputs_and_none():
    tensors = [sample("FP32"), sample("BYTES"), Tensor("e", "INT8", (0,), np.zeros(0, np.int8))]
    _, back = codec.decode(codec.encode(b"", tensors))
    assert [t.name for t in back] == [t.name for t in tensors]
    assert codec.decode(codec.encode(b"d", [])) == (b"d", [])


def test_parameters_that_are_not_scalars_are_not_encodable():
    tensor = sample("FP32")
    tensor.parameters["nested"] = {"a": 1}
    with pytest.raises(codec.UnencodableError):
        codec.encode(b"", [tensor])


VALID = codec.encode(b"some key", [sample("FP64"), sample("BYTES"), sample("BF16")])


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_corrupt_value(value):
    with contextlib.suppress(codec.CorruptValueError):
        codec.decode(value)


@given(st.integers(0, len(VALID) - 1), st.integers(1, 255), st.booleans())
def test_damaged_values_decode_or_raise_corrupt_value(at, flip, truncate):
    damaged = VALID[:at] if truncate else VALID[:at] + bytes([VALID[at] ^ flip]) + VALID[at + 1 :]
    with contextlib.suppress(codec.CorruptValueError):
        codec.decode(damaged)
    if truncate:
        with pytest.raises(codec.CorruptValueError):
            codec.decode(damaged)
