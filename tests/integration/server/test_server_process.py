"""Helpers and benchmarks that start a server measure their own server or stop with a clear
error: a taken port, a stranger answering on it, a server that exits
(tests/support/server_process.py).

The stranger is real: a listening socket, or an HTTP server answering 200 to everything (the
way the issue's benchmark measured someone else's server), held by this test process.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server_process import ServerCheckError, wait_until_serving
from tests.support.servers import free_port, run_cli_server

ROOT = Path(__file__).resolve().parents[3]


class _AlwaysReady(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def stranger() -> Iterator[int]:
    """Another server (this test process) answering 200 to every GET on a port."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysReady)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_taken_port_is_refused_before_the_server_starts(
    good_repository: Path, tmp_path: Path
) -> None:
    with (
        held_port() as port,
        pytest.raises(ServerCheckError) as error,
        run_cli_server(good_repository, tmp_path / "server.log", http_port=port),
    ):
        pytest.fail("a server on a taken port was taken for ours")
    assert f"port {port} is already in use by pid {os.getpid()}" in str(error.value)
    assert not (tmp_path / "server.log").exists()  # nothing was started


def test_a_stranger_answering_on_the_port_is_not_taken_for_our_server() -> None:
    """Our process is alive but does not listen; another answers 200 on its port."""
    with (
        stranger() as port,
        subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        ) as ours,
    ):
        try:
            with pytest.raises(ServerCheckError) as error:
                wait_until_serving(ours.pid, port, exit_code=ours.poll, timeout_s=30)
        finally:
            assert ours.stdin is not None
            ours.stdin.close()  # its read ends: it exits
    message = str(error.value)
    assert f"port {port} is served by pid {os.getpid()}" in message
    assert f"not by the server this run started (pid {ours.pid}" in message


def test_a_server_that_exits_is_reported_with_its_output(tmp_path: Path) -> None:
    with (
        pytest.raises(ServerCheckError) as error,
        run_cli_server(tmp_path / "none", tmp_path / "server.log"),
    ):
        pytest.fail("a server that exited was taken for serving")
    assert "exited with 2 before serving" in str(error.value)
    assert "is not a directory" in str(error.value)  # its own output, to say why


def _overload(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overload.py"), "--seconds", "0.5", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_overload_benchmark_stops_on_a_taken_port_and_prints_no_figures() -> None:
    with stranger() as port:
        result = _overload("--port", str(port))
    assert result.returncode == 1, result.stdout
    assert f"port {port} is already in use by pid {os.getpid()}" in result.stderr
    assert "Traceback" not in result.stderr
    assert "HTTP " not in result.stdout and "RSS" not in result.stdout


def test_the_overload_benchmark_measures_its_own_server() -> None:
    result = _overload("--clients", "4")
    assert result.returncode == 0, result.stderr
    assert "HTTP 200:" in result.stdout
    assert "live afterwards: True" in result.stdout


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "server_process.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_shell_scripts_check_refuses_strangers_too() -> None:
    """benchmarks/*.sh run tests/support/server_process.py: the same checks, by exit code."""
    assert int(_script("free-port").stdout) > 0
    with stranger() as port:
        taken = _script("check-free", str(port))
        assert taken.returncode == 1 and f"port {port} is already in use" in taken.stderr
        with subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        ) as ours:
            try:
                waited = _script("wait", str(ours.pid), str(port), "--timeout-s", "30")
            finally:
                assert ours.stdin is not None
                ours.stdin.close()
    assert waited.returncode == 1
    assert f"not by the server this run started (pid {ours.pid}" in waited.stderr
    assert _script("check-free", str(free_port())).returncode == 0
