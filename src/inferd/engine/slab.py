"""A shared-memory slab: one file in /dev/shm mapped by two processes, and the allocator its
writer uses to place tensors in it.

Each front end has two slabs per engine connection: requests (the front end allocates and
writes, the engine reads in place) and responses (the other way round). A tensor is written
once and read in place as an `np.ndarray` over the mapping: no pickling, no second copy.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from inferd.types import Array

ALIGN = 64  # a cache line: every tensor starts on one (numpy and the backends like aligned data)
DEFAULT_SLAB_BYTES = 64 << 20


def shm_directory() -> Path | None:
    """Where slab files go: /dev/shm (RAM, never written back to a disk) where it exists."""
    path = Path("/dev/shm")
    return path if path.is_dir() and os.access(path, os.W_OK) else None


class Slab:
    """A mapping of one slab file. The creator sizes it; the peer maps the same file."""

    def __init__(self, path: Path, size: int, create: bool = False) -> None:
        self.path = path
        self.size = size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = memoryview(self._map)

    def write(self, offset: int, array: Array) -> None:
        """`array`'s bytes at `offset` (one copy, C order)."""
        view = np.ndarray(array.shape, array.dtype, self.buffer, offset)
        view[...] = array

    def view(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> Array:
        """The array at `offset`, read in place (valid until its region is freed)."""
        return np.ndarray(shape, dtype, self.buffer, offset)

    def unlink(self) -> None:
        """Remove the file; the mappings stay valid until every view of them is gone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class SlabAllocator:
    """First fit over a sorted list of free extents, neighbours merged on free. A request
    holds a handful of tensors, so lists beat anything cleverer."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts: list[int] = [0]  # free extents, by start
        self._sizes: list[int] = [size]
        self._used: dict[int, int] = {}  # offset -> size, of allocated regions
        self.used_bytes = 0

    def alloc(self, nbytes: int) -> int:
        """The offset of a free region of `nbytes` (rounded up to ALIGN), or -1 if none."""
        need = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        for i, free in enumerate(self._sizes):
            if free >= need:
                start = self._starts[i]
                if free == need:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] = start + need
                    self._sizes[i] = free - need
                self._used[start] = need
                self.used_bytes += need
                return start
        return -1

    def free(self, offset: int) -> None:
        size = self._used.pop(offset)
        self.used_bytes -= size
        i = bisect.bisect(self._starts, offset)
        starts, sizes = self._starts, self._sizes
        if i > 0 and starts[i - 1] + sizes[i - 1] == offset:  # merge with the one before
            i -= 1
            sizes[i] += size
        else:
            starts.insert(i, offset)
            sizes.insert(i, size)
        if i + 1 < len(starts) and starts[i] + sizes[i] == starts[i + 1]:  # and the one after
            sizes[i] += sizes[i + 1]
            del starts[i + 1], sizes[i + 1]

    @property
    def regions(self) -> int:
        return len(self._used)
