"""`inferd.shared_array`'s argument checks and the server's store of segments: who builds,
who maps, what a failed or abandoned build leaves, and that a built segment is sealed."""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any

import numpy as np
import pytest

import inferd
from inferd.backends.python.shared_array_store import ArrayScope, SharedArrayError, SharedArrayStore

SCOPE = ArrayScope("m", "1", 7)


@pytest.mark.parametrize(
    ("name", "shape", "dtype", "build", "message"),
    [
        ("", 4, "f4", lambda: None, "name must be a non-empty string"),
        ("a", "4", "f4", lambda: None, "shape must be an int or a sequence of ints"),
        ("a", (2, -1), "f4", lambda: None, "shape [2, -1] has a negative dimension"),
        ("a", (2, 0), "f4", lambda: None, "shape [2, 0] holds no elements"),
        ("a", 4, object, lambda: None, "dtype object cannot be shared"),
        ("a", 4, "nonsense", lambda: None, "dtype 'nonsense' is not a numpy dtype"),
        ("a", 4, "f4", None, "build must be a callable"),
        ("a", 4, "f4", lambda: [1, 2, 3, 4], "build() returned list, not a numpy array"),
        ("a", 4, "f4", lambda: np.zeros(4, np.int32), "build() returned shape [4] int32"),
    ],
)
def test_bad_arguments_raise_naming_the_array(
    name: str, shape: Any, dtype: Any, build: Any, message: str
) -> None:
    with pytest.raises(SharedArrayError) as raised:
        inferd.shared_array(name, shape, dtype, build)
    assert message in str(raised.value)


def test_the_first_holder_builds_the_others_map_and_the_last_release_frees() -> None:
    store = SharedArrayStore()
    a, b = object(), object()
    role, fd = store.open(SCOPE, a, "t", (4,), "<f4")
    assert role == "build"
    with mmap.mmap(fd, 16) as writable:
        writable[:] = np.arange(4, dtype=np.float32).tobytes()
    store.built(SCOPE, a, "t", None)
    role_b, fd_b = store.open(SCOPE, b, "t", (4,), "<f4")
    assert role_b == "map"
    # Sealed: nobody can map it writable any more, not even with its descriptor.
    with pytest.raises(PermissionError):
        mmap.mmap(fd_b, 16, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    with mmap.mmap(fd_b, 16, mmap.MAP_SHARED, mmap.PROT_READ) as view:
        assert np.frombuffer(view, np.float32).tolist() == [0, 1, 2, 3]
    os.close(fd)
    os.close(fd_b)
    with pytest.raises(SharedArrayError, match=r"exists with shape \[4\] float32"):
        store.open(SCOPE, b, "t", (4,), "<f8")
    # Another load of the same version does not see it.
    assert store.open(ArrayScope("m", "1", 8), b, "t", (4,), "<f4")[0] == "build"
    store.release(a)
    assert "m/1:t" in store.names()
    store.release(b)
    assert store.names() == []


def test_a_builder_that_died_builds_again_and_a_failed_build_passes_the_turn() -> None:
    store = SharedArrayStore()
    a, b = object(), object()
    os.close(store.open(SCOPE, a, "t", (4,), "<f4")[1])
    # `a`'s worker died while building: its restarted worker asks again and builds.
    role, fd = store.open(SCOPE, a, "t", (4,), "<f4")
    os.close(fd)
    assert role == "build"
    roles: list[str] = []

    def other() -> None:  # waits while `a` builds
        role, fd = store.open(SCOPE, b, "t", (4,), "<f4")
        os.close(fd)
        roles.append(role)

    waiter = threading.Thread(target=other)
    waiter.start()
    store.built(SCOPE, a, "t", "build() raised")
    waiter.join(timeout=30)
    assert roles == ["build"]  # the failed build's segment went; `b` builds its own
    store.release(b)
    assert store.names() == []
