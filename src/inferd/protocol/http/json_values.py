"""JSON tensor data -> numpy, checked exactly against the input's datatype.

JSON numbers arrive as Python ints and floats, and `np.asarray` infers one array type for
them; every check here runs on that array (a few C passes), never element by element, except
the search for booleans among numbers, which walks types in C (`map(type, ...)`), and only
in a document whose text holds `true` or `false` (rest_codec.py looks).

What is refused, each with a 400 naming the input (as Triton does):
- booleans anywhere but a BOOL input (`[true, 2]` was read as `[1, 2]`), and anything but
  booleans for a BOOL input;
- floats for an integer input unless they are whole numbers; strings for numbers;
- values outside the datatype's range: integers past int8..uint64, and numbers whose cast
  would become infinite (JSON has no inf: FP16's largest is 65504, `4294967296` used to wrap
  in an int64 sum of squares and pass, coming back as inf).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from inferd.errors import invalid
from inferd.types import Array


def from_json(
    data: Any,
    datatype: str,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    count: int,
    where: str,
    booleans: bool = True,
) -> Array:
    """A JSON input's `data` (nested or flat) as an array of `shape`. `booleans`: False when
    the document holds no `true` or `false` at all (the caller looked at its text)."""
    if not isinstance(data, list):
        data = [data]
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1)
            if flat.size != count:  # before the walk: the declared count is the bounded one
                raise invalid(
                    f"{where}: data holds {flat.size} elements but shape {list(shape)} needs "
                    f"{count}"
                )
            array = np.empty(flat.size, dtype=object)
            for k, item in enumerate(flat):  # variable-length elements: no vector form
                if isinstance(item, str):
                    array[k] = item.encode("utf-8")
                else:
                    raise invalid(f"{where}: BYTES data must be strings, got {type(item).__name__}")
        else:
            array = typed_json_array(data, datatype, dtype, where, booleans)
    except (ValueError, TypeError, OverflowError) as exc:
        raise invalid(f"{where}: data does not fit datatype {datatype}: {exc}") from None
    if array.size != count:
        raise invalid(
            f"{where}: data holds {array.size} elements but shape {list(shape)} needs {count}"
        )
    return array.reshape(shape)


# JSON value kinds (as numpy infers them) that each datatype accepts: no silent truncation of
# 1.5 to an integer, no parsing of numbers out of strings, no booleans as numbers.
_ACCEPTED_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}


def _overflow_limit(scalar: Any) -> float:
    """The smallest magnitude that rounds to infinity when cast to `scalar`'s type: its
    largest finite value plus half a unit in the last place (JSON's shortest text for
    float32's largest value, 3.4028235e+38, reads back slightly above it and still casts
    to it). ml_dtypes.finfo knows numpy's float types and bfloat16 alike."""
    largest = float(ml_dtypes.finfo(scalar).max)  # type: ignore[no-untyped-call]
    return largest + (largest - float(np.nextafter(scalar(largest), scalar(0)))) / 2


# By datatype: FP16 and BF16 have the same size but not the same range.
_OVERFLOW = {
    "FP16": _overflow_limit(np.float16),
    "BF16": _overflow_limit(ml_dtypes.bfloat16),
    "FP32": _overflow_limit(np.float32),
}


def _has_bool(data: list[Any]) -> bool:
    """Whether a (nested) JSON list holds a boolean: numpy reads `[true, 2]` as `[1, 2]`."""
    kinds = set(map(type, data))
    if bool in kinds:
        return True
    return list in kinds and any(_has_bool(x) for x in data if type(x) is list)


def typed_json_array(
    data: list[Any], datatype: str, dtype: np.dtype[Any], where: str, booleans: bool = True
) -> Array:
    """JSON numbers (or booleans, for BOOL) as an array of `dtype`, or INVALID_ARGUMENT.
    `booleans` False: the document has none (no search for them among the numbers)."""
    inferred = np.asarray(data)
    if inferred.size == 0:
        return inferred.astype(dtype)
    kind = inferred.dtype.kind
    if booleans and kind in "iuf" and _has_bool(data):
        raise invalid(
            f"{where}: {datatype} data must be numbers, got booleans among them (true/false "
            "are only for BOOL inputs)"
        )
    if dtype.kind in "iu" and kind in "fO":
        # numpy infers float (or object) for ints beyond int64 mixed with others: convert the
        # original values exactly, but only if they are all whole numbers (a value out of
        # range raises OverflowError there: a 400 too).
        if kind == "f" and not np.array_equal(inferred, np.floor(inferred)):
            raise invalid(f"{where}: {datatype} data must be integers, got floats")
        return np.asarray(data, dtype=dtype)
    # bfloat16 is an extension dtype (kind "V") that takes JSON numbers as floats do.
    target_kind = "f" if datatype == "BF16" else dtype.kind
    accepted = _ACCEPTED_KINDS[target_kind]
    if kind not in accepted:
        expected = {"b": "true/false", "iu": "integers", "iuf": "numbers"}[accepted]
        raise invalid(f"{where}: {datatype} data must be {expected}, got {_kind_name(inferred)}")
    if dtype.kind in "iu" and inferred.dtype != dtype:
        _check_int_range(inferred, datatype, dtype, where)
    # JSON has no inf or nan: a value the cast would turn into inf is an error, found before
    # the cast (which would warn). The largest magnitude, as a float: an int64's square (or
    # its absolute value, for -2**63) wraps, and 4294967296 passed an int64 sum of squares.
    limit = _OVERFLOW.get(datatype)
    if limit is not None and inferred.dtype.itemsize > dtype.itemsize:
        # The ufuncs' own reductions: ndarray.max() adds a Python wrapper per call, which
        # costs more than the pass itself on a request's few values.
        if kind == "f":  # one pass: a float's absolute value cannot wrap
            largest = float(np.maximum.reduce(np.abs(inferred), axis=None))
        else:
            high = float(np.maximum.reduce(inferred, axis=None))
            largest = max(high, -float(np.minimum.reduce(inferred, axis=None)))
        if largest >= limit:
            raise invalid(
                f"{where}: value {largest:g} is out of {datatype}'s range (largest "
                f"{float(ml_dtypes.finfo(dtype).max):g})"  # type: ignore[no-untyped-call]
            )
    return inferred.astype(dtype, copy=False)


def _check_int_range(inferred: Array, datatype: str, dtype: np.dtype[Any], where: str) -> None:
    info = np.iinfo(dtype)
    # As Python numbers, compared exactly: numpy would round int64's max up to the float
    # 2**63 and let that value through.
    low = np.minimum.reduce(inferred, axis=None).item()
    high = np.maximum.reduce(inferred, axis=None).item()
    if low < int(info.min) or high > int(info.max):
        raise invalid(
            f"{where}: values {low}..{high} are out of {datatype}'s range "
            f"{int(info.min)}..{int(info.max)}"
        )


def _kind_name(array: Array) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings"}.get(
        array.dtype.kind, "mixed or nested values"
    )
