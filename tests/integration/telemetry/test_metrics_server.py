"""The metrics port (metrics/metrics_endpoint.py): no thread per connection, idle
connections closed,
open connections capped, keep-alive scrapes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferd.limits import Limits
from inferd.metrics.metrics_endpoint import MAX_CONNECTIONS
from tests.support.servers import STATE_DEADLINE_S, RunningServer, run_server


@pytest.fixture(scope="module")
def metrics_server(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, limits=Limits(header_timeout_s=1.0)) as running:
        yield running


def _wait(condition: object, what: str) -> None:
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not reached within {STATE_DEADLINE_S:.0f} s: {what}"
        time.sleep(0.005)


def test_idle_connections_take_no_thread_and_are_closed(metrics_server: RunningServer) -> None:
    server = metrics_server.server.metrics_server
    assert server is not None
    threads = threading.active_count()
    idle = [
        socket.create_connection(("127.0.0.1", server.port), timeout=STATE_DEADLINE_S)
        for _ in range(MAX_CONNECTIONS)
    ]
    _wait(lambda: server._open == MAX_CONNECTIONS, "every idle connection accepted")
    assert threading.active_count() == threads
    # Past the cap, a connection is answered 503 and closed at once.
    with socket.create_connection(("127.0.0.1", server.port), timeout=STATE_DEADLINE_S) as late:
        answer = b""
        while chunk := late.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 503")
    # The idle ones are closed by the server after the header timeout ...
    for sock in idle:
        assert sock.recv(1) == b""
        sock.close()
    _wait(lambda: server._open == 0, "the idle connections are gone")
    # ... and scrapes are served as before.
    r = httpx.get(metrics_server.metrics_url, timeout=10)
    assert r.status_code == 200 and "inferd_" in r.text


def test_a_slow_request_head_is_dropped(metrics_server: RunningServer) -> None:
    server = metrics_server.server.metrics_server
    assert server is not None
    with socket.create_connection(("127.0.0.1", server.port), timeout=STATE_DEADLINE_S) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: t\r\n")  # never finished
        assert sock.recv(1) == b""


def test_methods_and_errors(metrics_server: RunningServer) -> None:
    url = metrics_server.metrics_url
    with httpx.Client(timeout=10) as c:
        assert c.get(url).status_code == 200
        assert c.head(url).status_code == 200
        assert c.post(url).status_code == 405
        assert c.get(url.replace("/metrics", "/other")).status_code == 404
        assert c.get(url, params={"format": "json"}).status_code == 400
        # A keep-alive connection serves scrape after scrape.
        for _ in range(3):
            assert c.get(url, headers={"Accept-Encoding": "identity"}).text.startswith("# HELP")
