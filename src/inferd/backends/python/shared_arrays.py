"""`inferd.shared_array`: a large read-only array (an embedding table) in shared memory, built
once and mapped by every instance of the model, in the server or in worker processes.

The caller's side, in whichever process runs the model's code: it checks the arguments,
asks the instance's host for the segment (the server's store decides who builds:
shared_array_store.py), builds it through a writable mapping if told to, and returns a
read-only view of a read-only mapping. Outside an inferd server (a model's own unit test)
there is nobody to share with: it builds and returns a read-only array.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.backends.python.shared_array_store import SharedArrayError, describe_layout

if TYPE_CHECKING:
    from inferd.backends.python.pb_utils.host import ModelHost

__all__ = ["SharedArrayError", "shared_array"]

_DTYPE_KINDS = "biufc"  # bool, integers, floats, complex: fixed size, no Python objects
_building = threading.local()  # names this thread is building (a build that asks for itself)


def shared_array(
    name: str,
    shape: int | Sequence[int],
    dtype: Any,
    build: Callable[[], Any],
) -> np.ndarray[Any, Any]:
    """The model's read-only array `name` of `shape` and `dtype`, shared by every instance
    of this model version (in the server's threads and in worker processes).

    The first instance to ask calls `build()`, which must return an array of exactly that
    shape and dtype; the others wait for it and map the same memory (their `build` is not
    called). Call it from `load` / `initialize` (or any model method the server runs).
    Raises SharedArrayError naming the array for bad arguments, a build of the wrong
    shape or dtype, or a name that exists with another shape or dtype.
    """
    dims, dt = _checked(name, shape, dtype, build)
    from inferd.backends.python.pb_utils.host import current_array_host

    host: ModelHost | None = current_array_host()
    if host is None:
        built = _built(name, dims, dt, build)
        built.flags.writeable = False
        return built
    role, fd = host.shared_array_open(name, dims, dt.str)
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    try:
        if role == "build":
            try:
                _build_into(fd, nbytes, name, dims, dt, build)
            except BaseException as exc:
                host.shared_array_built(name, str(exc) or type(exc).__name__)
                raise
            host.shared_array_built(name, None)
        view = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)  # the mapping keeps the memory
    # A read-only mapping's buffer: numpy refuses writes, and refuses to make it writable.
    return np.frombuffer(view, dt).reshape(dims)


def _checked(
    name: object, shape: object, dtype: Any, build: object
) -> tuple[tuple[int, ...], np.dtype[Any]]:
    if not isinstance(name, str) or not name or len(name) > 128 or "\0" in name:
        raise SharedArrayError(
            f"inferd.shared_array: name must be a non-empty string of at most 128 characters, "
            f"got {name!r}"
        )
    where = f"inferd.shared_array('{name}')"
    dims_in = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims_in, Sequence) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims_in
    ):
        raise SharedArrayError(
            f"{where}: shape must be an int or a sequence of ints, got {shape!r}"
        )
    dims = tuple(int(d) for d in dims_in)
    if any(d < 0 for d in dims):
        raise SharedArrayError(f"{where}: shape {list(dims)} has a negative dimension")
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError as exc:
        raise SharedArrayError(f"{where}: dtype {dtype!r} is not a numpy dtype ({exc})") from None
    if dt.kind not in _DTYPE_KINDS:
        raise SharedArrayError(
            f"{where}: dtype {dt} cannot be shared; use a bool, integer, float or complex dtype"
        )
    if int(np.prod(dims, dtype=np.int64)) == 0:
        raise SharedArrayError(f"{where}: shape {list(dims)} holds no elements")
    if not callable(build):
        raise SharedArrayError(f"{where}: build must be a callable returning the array")
    return dims, dt


def _built(
    name: str, dims: tuple[int, ...], dt: np.dtype[Any], build: Callable[[], Any]
) -> np.ndarray[Any, Any]:
    """build()'s array, checked: exactly the declared shape and dtype."""
    names: set[str] = _building.__dict__.setdefault("names", set())
    if name in names:
        raise SharedArrayError(f"inferd.shared_array('{name}'): its build() asked for it again")
    names.add(name)
    try:
        value = build()
    finally:
        names.discard(name)
    if not isinstance(value, np.ndarray):
        raise SharedArrayError(
            f"inferd.shared_array('{name}'): build() returned {type(value).__name__}, "
            f"not a numpy array of {describe_layout(dims, dt.str)}"
        )
    if value.shape != dims or value.dtype != dt:
        raise SharedArrayError(
            f"inferd.shared_array('{name}'): build() returned "
            f"{describe_layout(value.shape, value.dtype.str)}, not the declared "
            f"{describe_layout(dims, dt.str)}"
        )
    return value


def _build_into(
    fd: int,
    nbytes: int,
    name: str,
    dims: tuple[int, ...],
    dt: np.dtype[Any],
    build: Callable[[], Any],
) -> None:
    value = _built(name, dims, dt, build)
    writable = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        target = np.frombuffer(writable, dt).reshape(dims)
        np.copyto(target, value)
        del target  # its buffer must go before the mapping closes
    finally:
        writable.close()  # no writable mapping may remain: the segment is sealed next
