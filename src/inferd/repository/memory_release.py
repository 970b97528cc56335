"""Giving a released model version's memory back to the operating system.

Closing a version's instances frees its weights, but freeing is not returning: glibc's
malloc keeps freed memory for reuse. Measured (docs/benchmarks.md, "Memory across hot
swaps"), 20 swaps of a 64 MiB ONNX model and a 64 MiB Python model doubled the server's RSS.
Two things bring it back to its baseline (within about 2% in the same runs):

- after each release (a version swapped out or unloaded, a failed load, a reload pass that
  swapped nothing) the registry calls `MemoryReleaser.release` in a worker thread: a full
  garbage collection that reaches the permanent generation too (the server freezes what
  its first load made, and a frozen cycle, such as a model module, is never collected),
  then `malloc_trim(0)`; it measures and logs the RSS given back;
- `configure_allocator` at start: one malloc arena (see there why the trim alone is not
  enough).

Cost, once per release and never per request: one full collection (it holds the GIL, so
requests in flight pause for it: about 25 ms with 50,000 objects) and one trim (without the
GIL). The arena's cost on the request path is measured in docs/benchmarks.md. Without
glibc (musl, macOS) only the collection runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("inferd.memory")

MIB = 1 << 20
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def _libc_function(name: str, *argtypes: Any) -> Callable[..., int] | None:
    """A glibc malloc function, or None where the C library lacks it (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:
        return None
    function = getattr(libc, name, None)
    if function is None:
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_malloc_trim = _libc_function("malloc_trim", ctypes.c_size_t)
_mallopt = _libc_function("mallopt", ctypes.c_int, ctypes.c_int)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size now (Linux; 0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def configure_allocator() -> None:
    """One malloc arena for the whole process (glibc), unless the environment chose
    (MALLOC_ARENA_MAX, GLIBC_TUNABLES). Called once at start, before the server's threads.

    Why: glibc gives each thread that allocates an arena of its own (up to 8 per core), and
    a version loads in worker threads, so its weights land in those arenas. `malloc_trim`
    returns the free pages inside every arena, but not the free space at the top of a
    thread's arena, which glibc keeps up to its trim threshold (32-64 MiB once large blocks
    have been freed): measured, 20 swaps ended 15-18% over the baseline with the trim alone,
    about 2% with one arena. Cost: threads that allocate blocks over tcache's 1 KiB at the
    same moment take turns on one lock (docs/benchmarks.md measures the request path).
    """
    if _mallopt is None:
        return
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        log.info("malloc arenas as the environment sets them")
        return
    _mallopt(M_ARENA_MAX, 1)


def malloc_trim() -> bool:
    """Return the C heap's free pages to the OS (every malloc arena); False where the C
    library has no malloc_trim. ctypes drops the GIL for the call."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def collect_everything() -> None:
    """A full collection that reaches frozen objects too, which are frozen again after.

    Re-freezing keeps field lesson 10's benefit for the versions loaded since (their
    objects live as long as the version: out of every later scan). It also freezes what
    requests in flight hold at that instant; of that, only what later becomes cyclic
    garbage stays uncollected (a request's objects are mostly freed by reference counts).
    """
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()  # what survived is long-lived: out of later scans again (field lesson 10)


class MemoryReleaser:
    """Runs the release after a version is let go and counts the memory given back."""

    def __init__(self) -> None:
        # Serialised: two models released at once would each measure the other's drop.
        self._lock = threading.Lock()
        self.returned_bytes = 0  # inferd_process_memory_returned_bytes_total

    def release(self, model: str, versions: list[str], why: str, rss_before: int) -> int:
        """Collect and trim after `model` let `versions` go (`why`: unloaded, load_failed,
        or reloaded: a pass that swapped nothing); `rss_before` is the RSS read before the
        versions closed (or now). Blocking: call it in a worker thread. Returns the bytes
        given back (the RSS drop, 0 if none)."""
        with self._lock:
            started = time.monotonic()
            collect_everything()
            untrimmed = rss_bytes()
            trimmed = malloc_trim()
            after = rss_bytes()
            returned = max(0, rss_before - after)
            self.returned_bytes += returned
            log.info(
                "released model %s%s (%s): RSS %.0f MiB -> %.0f MiB, %.0f MiB given back "
                "(%s) in %.0f ms",
                model,
                f" version {','.join(versions)}" if versions else "",
                why,
                rss_before / MIB,
                after / MIB,
                returned / MIB,
                f"{max(0, untrimmed - after) / MIB:.0f} MiB by malloc_trim"
                if trimmed
                else "no malloc_trim in this C library",
                (time.monotonic() - started) * 1000,
                extra={
                    "event": "memory_released",
                    "model": model,
                    "versions": versions,
                    "reason": why,
                    "rss_before_bytes": rss_before,
                    "rss_after_bytes": after,
                    "returned_bytes": returned,
                    "trimmed_bytes": max(0, untrimmed - after) if trimmed else 0,
                },
            )
            return returned
