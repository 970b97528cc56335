"""Is the server answering on a port the one we started? For every test helper and benchmark
that starts a server as its own process.

A benchmark once measured a stranger: its port was taken, its own server failed to bind and
exited, and it went on loading whatever answered there (all 404s, "RSS 0 MiB"). So a started
server counts as up only when its process is alive, the port answers, and every socket
listening on that port belongs to that process or one of its children (`--workers N`: the
workers are the supervisor's children); anything else is an error saying who holds the port.
The ownership check reads Linux's /proc; elsewhere only liveness and the answer are checked.

Standard library only, so shell scripts can run it with any Python 3:

    python3 tests/support/server_process.py free-port
    python3 tests/support/server_process.py check-free PORT
    python3 tests/support/server_process.py wait PID PORT [PATH] [--timeout-s 120] [--listeners N]
    python3 tests/support/server_process.py owns PID PORT
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # the TCP state in /proc/net/tcp


class ServerCheckError(RuntimeError):
    """The server we started is not the one serving (or not serving at all)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now; the server gets it at run time, never a fixed one."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening_inodes(port: int) -> set[int] | None:
    """Inodes of the TCP sockets listening on `port` (any address), or None without /proc."""
    tables = [PROC / "net" / "tcp", PROC / "net" / "tcp6"]
    if not tables[0].exists():
        return None
    inodes = set()
    for table in tables:
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Field 4 is the parent; the command (field 2) may hold spaces and parentheses.
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _family(pid: int) -> set[int]:
    tree, family, todo = _children(), set(), [pid]
    while todo:
        p = todo.pop()
        family.add(p)
        todo.extend(tree.get(p, []))
    return family


def _socket_owners(pids: set[int] | None = None) -> dict[int, int]:
    """socket inode -> pid, over `pids` (default: every process we may look into)."""
    owners: dict[int, int] = {}
    candidates = (
        pids if pids is not None else {int(e.name) for e in PROC.iterdir() if e.name.isdigit()}
    )
    for pid in candidates:
        try:
            for fd in (PROC / str(pid) / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owners[int(target[8:-1])] = pid
        except OSError:
            continue  # gone, or another user's
    return owners


def _describe(pid: int) -> str:
    try:
        cmd = " ".join(
            (PROC / str(pid) / "cmdline").read_bytes().decode().replace("\0", " ").split()
        )
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"


def holder(port: int) -> str | None:
    """Who listens on `port` now ('pid 123 (cmd)', 'a process of another user'), or None."""
    inodes = _listening_inodes(port)
    if inodes is None:  # no /proc: try to bind instead
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return "another process"
        return None
    if not inodes:
        return None
    owners = _socket_owners()
    known = [owners[i] for i in inodes if i in owners]
    return _describe(known[0]) if known else "a process of another user"


def check_port_free(port: int) -> None:
    """Before starting a server on a fixed port: refuse at once if something holds it."""
    who = holder(port)
    if who is not None:
        raise ServerCheckError(
            f"port {port} is already in use by {who}: stop it, or use another port"
        )


def listeners_of(pid: int, port: int) -> int | None:
    """How many sockets listen on `port` for `pid` and its children; ServerCheckError if
    another process listens there too. None where /proc cannot tell."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    ours = _socket_owners(_family(pid))
    strangers = inodes - set(ours)
    if strangers:
        owners = _socket_owners()
        known = [owners[i] for i in strangers if i in owners]
        who = _describe(known[0]) if known else "a process of another user"
        raise ServerCheckError(
            f"port {port} is served by {who}, not by the server this run started ({_describe(pid)})"
        )
    return len(inodes)


def status_of(url: str) -> int | None:
    """The HTTP status `url` answers with; None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def wait_until_serving(
    pid: int,
    port: int,
    path: str = "/v2/health/ready",
    *,
    exit_code: Callable[[], int | None],
    output: Callable[[], str] = lambda: "",
    timeout_s: float = 120.0,
    listeners: int = 1,
    host: str = "127.0.0.1",
) -> None:
    """Wait until `pid` is serving `path` with a 200 on `port`, through `listeners` sockets
    of its own (N for `--workers N`: each worker listens once its models are loaded).
    `exit_code` says whether it has exited (Popen.poll for a child). ServerCheckError if it
    exits first, if another process answers or listens on the port, or at the deadline."""
    url = f"http://{host}:{port}{path}"
    deadline = time.monotonic() + timeout_s
    while True:
        code = exit_code()
        if code is not None:
            raise ServerCheckError(
                f"the server ({_describe(pid)}) exited with {code} before serving {url}:\n"
                f"{output()}"
            )
        status = status_of(url)
        if status is not None:
            count = listeners_of(pid, port)  # raises if a stranger listens there
            enough = count is None or count >= listeners
            if status == 200 and enough and exit_code() is None:  # still alive, still ours
                return
        if time.monotonic() > deadline:
            raise ServerCheckError(
                f"the server ({_describe(pid)}) did not serve {url} within {timeout_s:g} s "
                f"(last answer: {status}):\n{output()}"
            )
        time.sleep(0.1)


def check_still_serving(pid: int, port: int, exit_code: Callable[[], int | None]) -> None:
    """After a measurement: the server is still alive and still the one on the port."""
    code = exit_code()
    if code is not None:
        raise ServerCheckError(f"the server ({_describe(pid)}) exited with {code} during the run")
    count = listeners_of(pid, port)
    if count == 0:
        raise ServerCheckError(f"the server ({_describe(pid)}) no longer listens on port {port}")


def _exit_code_of(pid: int) -> Callable[[], int | None]:
    """For a pid that is not our child (a shell's background job): gone or a zombie."""

    def exit_code() -> int | None:
        try:
            state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return -1  # gone; its real code is its parent's to read
            except PermissionError:
                return None
            return None
        return -1 if state == "Z" else None

    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="server_process.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("free-port", help="print a port nobody listens on")
    check = commands.add_parser("check-free", help="exit 1 if something listens on PORT")
    check.add_argument("port", type=int)
    wait = commands.add_parser("wait", help="wait until PID serves PATH on PORT, and only it")
    wait.add_argument("pid", type=int)
    wait.add_argument("port", type=int)
    wait.add_argument("path", nargs="?", default="/v2/health/ready")
    wait.add_argument("--timeout-s", type=float, default=120.0)
    wait.add_argument("--listeners", type=int, default=1, help="sockets it must listen with")
    wait.add_argument("--log", type=Path, default=None, help="its log, shown if it fails")
    owns = commands.add_parser("owns", help="exit 1 unless PID (and children) alone listen on PORT")
    owns.add_argument("pid", type=int)
    owns.add_argument("port", type=int)
    args = parser.parse_args(argv)
    try:
        if args.command == "free-port":
            print(free_port())
        elif args.command == "check-free":
            check_port_free(args.port)
        elif args.command == "owns":
            check_still_serving(args.pid, args.port, _exit_code_of(args.pid))
        else:
            log: Path | None = args.log

            def output() -> str:
                if log is None or not log.exists():
                    return ""
                return "\n".join(log.read_text(errors="replace").splitlines()[-30:])

            wait_until_serving(
                args.pid,
                args.port,
                args.path,
                exit_code=_exit_code_of(args.pid),
                output=output,
                timeout_s=args.timeout_s,
                listeners=args.listeners,
            )
    except ServerCheckError as e:
        print(f"server_process.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
