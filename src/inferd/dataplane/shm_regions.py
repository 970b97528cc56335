"""System shared memory (Triton's `system_shared_memory` extension): the regions clients
registered, and the tensors requests read from and write to them.

A client creates a POSIX shared-memory object (`/dev/shm/<key>`), registers a window of it
under a name (`key`, `offset`, `byte_size`), and then names the region in an input's or a
requested output's parameters instead of sending bytes: inputs are read in place (numpy views
of the mapping, no copy), outputs are written into the client's region and the response
carries no data for them.

What keeps the server safe from what a client registers:
- A key is a shared-memory *name*, never a path: `/name` or `name` means `/dev/shm/name`;
  a `/` inside, `.`, `..` and NUL are refused. The object is opened with O_NOFOLLOW and must
  be a regular file, so a symlink planted in /dev/shm cannot make the server map another file.
- Every window a request names (offset + byte size) is checked against its region.
- A region used by a request (queued or executing) stays mapped until the last such request
  finishes, even when it is unregistered meanwhile: each request holds a `Lease`.

The table lives on the event loop (registration and leases happen there): no locks.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from typing import Any

import numpy as np

from inferd.datatypes import ITEMSIZE, V2_TO_WIRE
from inferd.errors import ErrorKind, InferdError, invalid, not_found
from inferd.tensors.wire_format import (
    BYTE_SIZE,
    MAX_BYTES_ELEMENTS,
    NO_DATA,
    OFFSET,
    decode_bytes_elements,
    to_binary,
)
from inferd.types import Array, InferRequest, SharedMemoryRef, Tensor, element_count

SHM_DIRECTORY = "/dev/shm"
MAX_REGIONS = 1024  # each region is a mapping: bound how many a client can make us hold
_NAME_MAX = 255  # the longest file name Linux allows in /dev/shm

CUDA_UNSUPPORTED = "CUDA shared memory is not supported on this server (no CUDA device)"


def shm_path(key: str) -> str:
    """The /dev/shm file of a POSIX shared-memory key (`/name` or `name`), or a 400."""
    name = key[1:] if key.startswith("/") else key
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > _NAME_MAX:
        raise invalid(
            f"system shared memory key {key!r} is not a POSIX shared-memory name: give "
            f"'/name' or 'name' (at most {_NAME_MAX} characters, no '/' inside, not '.' or "
            "'..', no NUL); keys name objects in /dev/shm, never file paths"
        )
    return os.path.join(SHM_DIRECTORY, name)


class Region:
    """One registered window of a shared-memory object, mapped once."""

    __slots__ = (
        "name",
        "key",
        "offset",
        "byte_size",
        "buffer",
        "readonly",
        "users",
        "is_registered",
        "_mmap",
    )

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        # mmap offsets must be multiples of the allocation granularity: map from the one
        # below and slice the window out.
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        self._mmap: mmap.mmap | None = mmap.mmap(fd, offset + byte_size - start, offset=start)
        window = memoryview(self._mmap)[offset - start :]
        self.buffer = window  # outputs are written here
        self.readonly = window.toreadonly()  # inputs are read from here: models can't write
        self.users = 0  # requests holding a lease on it
        # Unregistered while users remain: still mapped, closed as the last one finishes.
        self.is_registered = True

    @property
    def is_mapped(self) -> bool:
        return self._mmap is not None

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def close(self) -> None:
        """Unmap now, or, if a numpy view made from it is still alive somewhere (a model
        that kept its input), as soon as the last one goes (CPython frees the mapping
        with its last reference)."""
        mapping, self._mmap = self._mmap, None
        if mapping is None:
            return
        # BufferError: views remain; the mapping goes with the last of them.
        for view in (self.readonly, self.buffer):
            with contextlib.suppress(BufferError):
                view.release()
        with contextlib.suppress(BufferError):
            mapping.close()

    def check_window(self, ref: SharedMemoryRef, where: str) -> None:
        """Check that `ref`'s offset and size lie inside this region (a 400 otherwise)."""
        if ref.offset + ref.byte_size > self.byte_size:
            raise invalid(
                f"{where}: {OFFSET} {ref.offset} + {BYTE_SIZE} {ref.byte_size} run past the "
                f"{self.byte_size} bytes of system shared memory region '{self.name}'"
            )


class Lease:
    """The regions one request uses, held from its decoding until its answer is built."""

    __slots__ = ("_regions", "outputs")

    def __init__(self) -> None:
        self._regions: list[Region] = []
        self.outputs: dict[str, tuple[Region, SharedMemoryRef]] = {}

    def hold(self, region: Region) -> None:
        if any(r is region for r in self._regions):
            return  # one hold per request, however many of its tensors are there
        region.users += 1
        self._regions.append(region)

    def release(self) -> None:
        regions, self._regions = self._regions, []
        for region in regions:
            region.users -= 1
            if region.users == 0 and not region.is_registered:
                region.close()

    def write_outputs(self, tensors: list[Tensor]) -> list[Tensor]:
        """Write the outputs the request placed in shared memory into their regions; the
        response keeps their name, datatype and shape, and no data."""
        chunks: list[tuple[Tensor, bytes | memoryview | None]] = []
        for tensor in tensors:  # check every size first: nothing is written unless all fit
            target = self.outputs.get(tensor.name)
            if target is None:
                continue
            region, ref = target
            raw = to_binary(tensor) if tensor.datatype == "BYTES" else None
            needed = (
                len(raw)
                if raw is not None
                else element_count(tensor.shape) * ITEMSIZE[tensor.datatype]
            )
            if needed > ref.byte_size:
                raise invalid(
                    f"output '{tensor.name}' needs {needed} bytes, but its {BYTE_SIZE} in "
                    f"system shared memory region '{region.name}' is {ref.byte_size}"
                )
            chunks.append((tensor, raw))
        if not chunks:
            return tensors
        written: dict[str, Tensor] = {}
        for tensor, raw in chunks:
            region, ref = self.outputs[tensor.name]
            if raw is not None:
                region.buffer[ref.offset : ref.offset + len(raw)] = raw
            else:
                wire = V2_TO_WIRE[tensor.datatype]
                count = element_count(tensor.shape)
                view = np.frombuffer(region.buffer, wire, count, ref.offset)
                np.copyto(view.reshape(tensor.shape), tensor.data, casting="same_kind")
            written[tensor.name] = Tensor(
                tensor.name, tensor.datatype, tensor.shape, NO_DATA, shared_memory=ref
            )
        return [written.get(t.name, t) for t in tensors]


class SharedMemoryRegistry:
    """The system shared-memory regions of one server, by name."""

    def __init__(
        self,
        max_regions: int = MAX_REGIONS,
        max_copy_bytes: int = 64 * 2**20,
        max_bytes_elements: int = MAX_BYTES_ELEMENTS,
    ) -> None:
        self.max_regions = max_regions
        # BYTES inputs are decoded into objects (a copy), unlike the in-place views of the
        # other types: bounded as a request body is (the server passes --max-request-mib).
        self.max_copy_bytes = max_copy_bytes
        self.max_bytes_elements = max_bytes_elements  # the server passes --max-bytes-elements
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """Map `byte_size` bytes at `offset` of the object `key` as region `name`."""
        if not name:
            raise invalid("a system shared memory region needs a non-empty name")
        if not isinstance(key, str):
            raise invalid(f"region '{name}': 'key' must be a string, got {key!r}")
        path = shm_path(key)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise invalid(f"region '{name}': 'offset' must be an integer >= 0, got {offset!r}")
        if not isinstance(byte_size, int) or isinstance(byte_size, bool) or byte_size < 1:
            raise invalid(
                f"region '{name}': 'byte_size' must be an integer >= 1, got {byte_size!r}"
            )
        if name in self.regions:
            # As Triton: a name is registered once; unregister it first to change it.
            raise InferdError(
                ErrorKind.ALREADY_EXISTS,
                f"system shared memory region '{name}' is already registered",
            )
        if len(self.regions) >= self.max_regions:
            raise invalid(
                f"{len(self.regions)} system shared memory regions are registered, the most "
                "this server holds; unregister some first"
            )
        fd = _open(name, key, path)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise invalid(f"region '{name}': key '{key}' is not a shared-memory object")
            if offset + byte_size > info.st_size:
                raise invalid(
                    f"region '{name}': offset {offset} + byte_size {byte_size} run past the "
                    f"{info.st_size} bytes of shared memory key '{key}'"
                )
            try:
                region = Region(name, key, offset, byte_size, fd)
            except OSError as exc:
                raise invalid(f"region '{name}': cannot map key '{key}': {exc.strerror}") from None
        finally:
            os.close(fd)
        self.regions[name] = region

    def unregister(self, name: str = "") -> None:
        """Forget region `name` (every region when ""); as Triton, an unknown name is no
        error. Requests already holding it keep it mapped until they finish."""
        names = [name] if name else list(self.regions)
        for n in names:
            region = self.regions.pop(n, None)
            if region is not None:
                region.is_registered = False
                if region.users == 0:
                    region.close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return [r.status() for r in self.regions.values()]
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"unknown system shared memory region '{name}'")
        return [region.status()]

    def lease(self, request: InferRequest) -> Lease:
        """Hold the regions `request` names, point its shared-memory inputs' data at them
        (numpy views, no copy) and note where its outputs go; raises a 400 naming the
        tensor and region when a region is unknown or a window does not fit."""
        lease = Lease()
        try:
            for tensor in request.inputs:
                ref = tensor.shared_memory
                if ref is not None:
                    where = f"input '{tensor.name}'"
                    region = self._region(ref, where)
                    lease.hold(region)
                    if tensor.datatype == "BYTES" and ref.byte_size > self.max_copy_bytes:
                        raise invalid(
                            f"{where}: a BYTES input in shared memory is copied, and its "
                            f"{ref.byte_size} bytes exceed the limit of {self.max_copy_bytes} "
                            "(--max-request-mib)"
                        )
                    tensor.data = _input_array(region, ref, tensor, where, self.max_bytes_elements)
            for out in request.outputs or ():
                ref = out.shared_memory
                if ref is not None:
                    region = self._region(ref, f"output '{out.name}'")
                    lease.hold(region)
                    lease.outputs[out.name] = (region, ref)
        except BaseException:
            lease.release()
            raise
        return lease

    def _region(self, ref: SharedMemoryRef, where: str) -> Region:
        region = self.regions.get(ref.region)
        if region is None:
            raise invalid(f"{where}: unknown system shared memory region '{ref.region}'")
        region.check_window(ref, where)
        return region


def _open(name: str, key: str, path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise invalid(
            f"region '{name}': no shared memory object has key '{key}'; create it first"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise invalid(f"region '{name}': key '{key}' is a symbolic link") from None
        raise invalid(f"region '{name}': cannot open key '{key}': {exc.strerror}") from None


def _input_array(
    region: Region, ref: SharedMemoryRef, tensor: Tensor, where: str, max_bytes_elements: int
) -> Array:
    count = element_count(tensor.shape)
    if tensor.datatype == "BYTES":
        chunk = region.readonly[ref.offset : ref.offset + ref.byte_size]
        decoded = decode_bytes_elements(chunk, count, where, max_bytes_elements)
        return decoded.reshape(tensor.shape)
    expected = count * ITEMSIZE[tensor.datatype]
    if ref.byte_size != expected:
        raise invalid(
            f"{where}: {BYTE_SIZE} is {ref.byte_size} but shape {list(tensor.shape)} of "
            f"{tensor.datatype} needs {expected} bytes"
        )
    array = np.frombuffer(region.readonly, V2_TO_WIRE[tensor.datatype], count, ref.offset)
    if not array.flags.aligned:
        array = array.copy()  # ONNX Runtime and numpy kernels want aligned buffers
    return array.reshape(tensor.shape)
