"""A shared-memory slab: one file in /dev/shm mapped by two processes, and the allocator its
writer uses to place tensors in it.

Each front end has two slabs per engine connection: requests (the front end allocates and
writes, the engine reads in place) and responses (the other way round). A tensor is written
once and read in place as an `np.ndarray` over the mapping: no pickling, no second copy.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from inferd.types import Array

ALIGN = 64  # a cache line: every tensor starts on one (numpy and the backends like aligned data)
MIN_CLASS = 256  # the smallest region (a multiple of ALIGN: every offset stays aligned)
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
        if array.flags.c_contiguous:
            self.buffer[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8).data
        else:
            np.ndarray(array.shape, array.dtype, self.buffer, offset)[...] = array

    def view(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> Array:
        """The array at `offset`, read in place (valid until its region is freed)."""
        return np.ndarray(shape, dtype, self.buffer, offset)

    def unlink(self) -> None:
        """Remove the file; the mappings stay valid until every view of them is gone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class SlabAllocator:
    """Size classes (powers of two from MIN_CLASS) over a bump pointer: a freed region goes
    on its class's free list and is the next of that class to be handed out. O(1) each way
    (a first-fit list cost microseconds per request); the price is up to 2x per region and
    no merging, bounded by the slab: past it `alloc` says -1 and the tensor goes inline."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._top = 0  # the bump pointer: never handed out at or past it
        self._free: dict[int, list[int]] = {}  # class size -> free offsets of that size
        self._used: dict[int, int] = {}  # offset -> class size, of allocated regions
        self.used_bytes = 0

    def alloc(self, nbytes: int) -> int:
        """The offset of a free region of at least `nbytes`, or -1 if there is none."""
        size = MIN_CLASS if nbytes <= MIN_CLASS else 1 << (nbytes - 1).bit_length()
        free = self._free.get(size)
        if free:
            offset = free.pop()
        elif self._top + size <= self.size:
            offset = self._top
            self._top += size
        else:
            return -1
        self._used[offset] = size
        self.used_bytes += size
        return offset

    def free(self, offset: int) -> None:
        size = self._used.pop(offset)
        self.used_bytes -= size
        self._free.setdefault(size, []).append(offset)

    @property
    def regions(self) -> int:
        return len(self._used)
