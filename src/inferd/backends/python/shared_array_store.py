"""The server's side of `inferd.shared_array`: the segments, who holds them, who builds them.

One store per server (`ServerHost.arrays`). A segment is an anonymous memory file
(`memfd_create`): it has no name in /dev/shm, so nothing can leak there, whatever dies how;
its memory goes when the last descriptor and the last mapping of it are gone. The server
holds the descriptor; every instance (a thread of the server, or a worker process, which
receives a copy of the descriptor over its pipe) maps it itself. The first instance to ask for
a name builds it through a writable mapping; once it reports the build done, the segment is
sealed against writes (`F_SEAL_WRITE`: even a model that maps it again cannot write it), and
every later instance maps it read-only.

Names are scoped by one load of one model version (`ArrayScope`): the instances of that load
share them; another model, another version, or a reload of the same version (whose files may
have changed) has its own. A segment goes when the last instance holding it closes.
"""

from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import dataclass, field

# Build done: no write, no resize, no further seal, from anyone. (Linux names: elsewhere
# `import inferd` still works, and creating a segment fails the load saying why.)
_SEALS = sum(
    getattr(fcntl, name, 0)
    for name in ("F_SEAL_WRITE", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL")
)
_MEMFD_NAME_LIMIT = 240  # the kernel keeps 249 bytes of a memfd's name


class SharedArrayError(ValueError):
    """A shared array asked for wrongly; its message names the array (it fails the load)."""


@dataclass(frozen=True, slots=True)
class ArrayScope:
    """One load of one model version: the instances that share its arrays."""

    model: str
    version: str
    load: int  # which load attempt (a reload of the same version is another)

    def describe(self, name: str) -> str:
        return f"shared array '{name}' of model '{self.model}' version {self.version}"


def describe_layout(shape: tuple[int, ...], dtype: str) -> str:
    import numpy as np  # the server has it; the store's import stays light

    return f"shape {list(shape)} {np.dtype(dtype).name}"


@dataclass(eq=False)
class _Segment:
    fd: int
    shape: tuple[int, ...]
    dtype: str  # numpy's dtype.str, e.g. '<f4'
    builder: object | None  # the holder building it; None once built
    holders: set[object] = field(default_factory=set)


class SharedArrayStore:
    """Segments by (scope, name). `holder`: whatever stands for one instance (its host)."""

    def __init__(self) -> None:
        self._segments: dict[tuple[ArrayScope, str], _Segment] = {}
        self._changed = threading.Condition()

    def open(
        self, scope: ArrayScope, holder: object, name: str, shape: tuple[int, ...], dtype: str
    ) -> tuple[str, int]:
        """("build", fd): the caller builds it, then calls `built`; ("map", fd): it is
        built. `fd` is the caller's own copy, to close. Waits while another instance builds
        it; raises SharedArrayError when it exists with another shape or dtype."""
        key = (scope, name)
        with self._changed:
            while True:
                segment = self._segments.get(key)
                if segment is None:
                    segment = _Segment(_create(scope, name, shape, dtype), shape, dtype, holder)
                    segment.holders.add(holder)
                    self._segments[key] = segment
                    return "build", os.dup(segment.fd)
                if (segment.shape, segment.dtype) != (shape, dtype):
                    raise SharedArrayError(
                        f"{scope.describe(name)} exists with "
                        f"{describe_layout(segment.shape, segment.dtype)}; this call asks for "
                        f"{describe_layout(shape, dtype)}"
                    )
                if segment.builder is None:
                    segment.holders.add(holder)
                    return "map", os.dup(segment.fd)
                if segment.builder is holder:
                    # Its worker died while building (one instance asks one call at a time):
                    # the restarted one builds again.
                    return "build", os.dup(segment.fd)
                self._changed.wait()  # another instance is building it

    def built(self, scope: ArrayScope, holder: object, name: str, error: str | None) -> None:
        """The build by `holder` is done (sealed from now on), or failed (`error`): the
        segment goes, and an instance waiting for it builds it instead."""
        key = (scope, name)
        unsealed: OSError | None = None
        with self._changed:
            segment = self._segments.get(key)
            if segment is None or segment.builder is not holder:
                return
            if error is None:
                try:
                    fcntl.fcntl(segment.fd, fcntl.F_ADD_SEALS, _SEALS)
                    segment.builder = None
                except OSError as exc:  # EBUSY: a writable mapping is still open
                    unsealed = exc
            if error is not None or unsealed is not None:
                segment.holders.discard(holder)
                self._drop(key, segment)
            self._changed.notify_all()
        if unsealed is not None:  # the builder's load fails
            raise SharedArrayError(f"{scope.describe(name)}: could not seal it ({unsealed})")

    def release(self, holder: object) -> None:
        """An instance closed: segments no instance holds any more go."""
        with self._changed:
            for key, segment in list(self._segments.items()):
                segment.holders.discard(holder)
                if segment.builder is holder or not segment.holders:
                    self._drop(key, segment)
            self._changed.notify_all()

    def names(self) -> list[str]:
        """`model/version:name` of every segment the store holds (for logs and tests)."""
        with self._changed:
            return sorted(f"{s.model}/{s.version}:{n}" for s, n in self._segments)

    def _drop(self, key: tuple[ArrayScope, str], segment: _Segment) -> None:
        del self._segments[key]
        os.close(segment.fd)


def _create(scope: ArrayScope, name: str, shape: tuple[int, ...], dtype: str) -> int:
    import numpy as np

    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    label = f"inferd-array:{scope.model}/{scope.version}:{name}"[:_MEMFD_NAME_LIMIT]
    try:
        fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError) as exc:  # not Linux, or no memfd
        raise SharedArrayError(f"{scope.describe(name)}: cannot create it here: {exc}") from None
    try:
        # Reserved now: memory that is not there fails the load with a message, rather than
        # the builder with SIGBUS on its first write.
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        os.close(fd)
        raise SharedArrayError(
            f"{scope.describe(name)}: cannot reserve {nbytes} bytes for it ({exc.strerror})"
        ) from None
    return fd
