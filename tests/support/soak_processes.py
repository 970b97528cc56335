"""The processes the soak starts and ends: the server's family (read from /proc), how one
process is named for good (pid and start time), and a Redis of the soak's own.

Every child the soak starts from its main thread gets Linux' parent-death signal, so that
not even a soak killed with SIGKILL leaves a server or a Redis behind; the rest is ended by
`Soak.kill_everything` (tests/support/soak_run.py), by id.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

from tests.support.redis_servers import OwnRedis


def die_with_the_soak() -> None:
    """A child's preexec_fn: SIGTERM it when the thread that started it ends (Linux'
    PR_SET_PDEATHSIG). Elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process for good
    (a pid alone may be reused once its process is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def family(root: int) -> dict[int, str]:
    """`root` and every process below it, by role: supervisor, worker (the supervisor's
    spawned children), resource_tracker, helper (below a worker)."""
    roles = {root: "supervisor"}
    for child in _children(root):
        cmd = _cmdline(child)
        roles[child] = (
            "worker" if b"spawn_main" in cmd
            else "resource_tracker" if b"resource_tracker" in cmd
            else "child"
        )  # fmt: skip
        todo = [] if roles[child] != "worker" else _children(child)
        while todo:
            pid = todo.pop()
            roles[pid] = "helper"
            todo += _children(pid)
    return roles


def workers_of(root: int) -> list[int]:
    return [p for p, role in family(root).items() if role == "worker"]


class SoakRedis(OwnRedis):
    """`redis-server` on a free port, killed with SIGKILL and started again on the same
    port, dying with the soak. Start it from the soak's main thread (the parent-death
    signal is the starting thread's)."""

    def __init__(self) -> None:
        super().__init__(preexec_fn=die_with_the_soak)
