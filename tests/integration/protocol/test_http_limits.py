"""Limits on every axis an HTTP client controls (protocol/http/parser_guard.py), over raw sockets:
head size, header count, URL length, header and body timeouts, idle connections and the
connection limit. Each refusal names its limit, and after each the server is still live and
ready and serves other clients."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from inferd.limits import HEALTH_RESERVE, Limits
from tests.support.http_wire import Wire, infer_request, outputs
from tests.support.servers import STATE_DEADLINE_S, RunningServer, run_server

LIMITS = Limits(
    max_header_bytes=2048,
    max_header_count=12,
    max_url_bytes=512,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    keep_alive_timeout_s=0.5,
)


@pytest.fixture(scope="module")
def limited(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, limits=LIMITS) as running:
        yield running


def serves_others(server: RunningServer) -> None:
    """Live, ready, and answering an inference on a fresh connection."""
    wire = Wire(server)
    wire.send(b"GET /v2/health/live HTTP/1.1\r\nhost: t\r\n\r\n")
    assert wire.response()[0] == 200
    wire.send(b"GET /v2/health/ready HTTP/1.1\r\nhost: t\r\n\r\n")
    assert wire.response()[0] == 200
    wire.send(infer_request([1.5]))
    status, _, body = wire.response()
    assert (status, outputs(body)) == (200, [1.5])
    wire.close()


def refused(wire: Wire, status: int, *words: str) -> None:
    """The answer is `status` with an error naming the limit, then the server closes."""
    got, headers, body = wire.response()
    assert got == status, body
    message = orjson.loads(body)["error"]
    for word in words:
        assert word in message
    assert headers["connection"] == "close"
    wire.sock.settimeout(STATE_DEADLINE_S)
    assert not wire.buffer and not wire._fill(), "the connection stayed open"
    wire.close()


HEAD = b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nhost: t\r\n"


def test_an_endless_header_value_is_refused_at_the_limit_while_others_are_served(
    limited: RunningServer,
) -> None:
    wire = Wire(limited)
    wire.send(HEAD + b"x-endless: ")
    stop = threading.Event()

    def flood() -> None:  # keeps sending the value until the server stops taking it
        try:
            while not stop.is_set():
                wire.sock.sendall(b"a" * 65536)
        except OSError:
            pass

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    try:
        for _ in range(5):
            serves_others(limited)
        refused(wire, 431, "request headers exceed 2 KiB", "--max-header-kib")
    finally:
        stop.set()
        sender.join(timeout=STATE_DEADLINE_S)
    serves_others(limited)


def test_headers_over_the_size_limit_in_one_read_are_431(limited: RunningServer) -> None:
    wire = Wire(limited)
    wire.send(HEAD + b"x-big: " + b"b" * 1500 + b"\r\nx-big2: " + b"b" * 1500 + b"\r\n\r\n")
    refused(wire, 431, "--max-header-kib")
    serves_others(limited)


def test_too_many_header_fields_are_431(limited: RunningServer) -> None:
    wire = Wire(limited)
    fields = b"".join(b"x-h%d: 1\r\n" % i for i in range(20))
    wire.send(b"GET /v2/health/live HTTP/1.1\r\nhost: t\r\n" + fields + b"\r\n")
    refused(wire, 431, "more than 12 header fields", "--max-header-count")
    serves_others(limited)


def test_a_url_over_the_limit_is_414(limited: RunningServer) -> None:
    wire = Wire(limited)
    wire.send(b"GET /v2/models/" + b"m" * 1000 + b" HTTP/1.1\r\nhost: t\r\n\r\n")
    refused(wire, 414, "request URL longer than 512 bytes", "--max-url-kib")
    serves_others(limited)


def test_a_head_that_never_ends_is_408(limited: RunningServer) -> None:
    wire = Wire(limited)
    wire.send(HEAD + b"x-slow: ")  # and nothing more
    refused(wire, 408, "request headers not received within 0.5 s", "--header-timeout-secs")
    serves_others(limited)


def test_a_body_that_stalls_is_408_and_its_memory_released(limited: RunningServer) -> None:
    for head in (HEAD, b"POST /v2/repository/index HTTP/1.1\r\nhost: t\r\n"):  # fast path, ASGI
        wire = Wire(limited)
        wire.send(head + b"content-length: 4000\r\n\r\n" + b"{" * 100)
        refused(wire, 408, "request body stalled", "--body-timeout-secs")
    serves_others(limited)


def test_idle_connections_are_closed_before_and_between_requests(limited: RunningServer) -> None:
    silent = Wire(limited)  # never sends a byte
    silent.sock.settimeout(STATE_DEADLINE_S)
    assert silent._fill() is False
    silent.close()
    wire = Wire(limited)
    wire.send(infer_request([4.0]))
    assert wire.response()[0] == 200
    wire.sock.settimeout(STATE_DEADLINE_S)
    assert wire._fill() is False  # closed after the keep-alive timeout
    wire.close()
    serves_others(limited)


STALL_KEEP_ALIVE_S = 2.0


@pytest.fixture(scope="module")
def kept_alive(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, limits=Limits(keep_alive_timeout_s=STALL_KEEP_ALIVE_S)) as s:
        yield s


def test_a_request_sent_in_time_is_served_after_the_loop_stalled_past_the_keep_alive(
    kept_alive: RunningServer,
) -> None:
    """A client's next request on a kept-alive connection, sent well inside the keep-alive
    timeout, is answered even when the server's event loop stalls past that timeout while
    handling other sockets' events (a long collection, a starved CPU). uvloop runs the
    timers that fell due before it reads the sockets again, so the keep-alive timer closed
    the connection with the request unread: the client got a reset (the soak saw three at
    once under load)."""
    wire = Wire(kept_alive)
    wire.send(infer_request([1.0]))
    assert wire.response()[0] == 200
    answered = time.monotonic()  # the server armed its keep-alive timer about now
    started, release = threading.Event(), threading.Event()
    ours, theirs = socket.socketpair()

    def stall() -> None:  # another socket's event, handled slowly: the loop stalls
        asyncio.get_running_loop().remove_reader(ours.fileno())
        started.set()
        release.wait(STATE_DEADLINE_S)

    async def watch() -> None:
        asyncio.get_running_loop().add_reader(ours.fileno(), stall)

    kept_alive.server.model_host.on_loop("stall", watch)
    theirs.send(b"x")
    assert started.wait(STATE_DEADLINE_S)
    wire.send(infer_request([2.0]))
    assert time.monotonic() - answered < STALL_KEEP_ALIVE_S / 2, "the client was late itself"
    while time.monotonic() < answered + STALL_KEEP_ALIVE_S * 1.5:  # the timer falls due
        time.sleep(0.02)
    release.set()
    try:
        status, _, body = wire.response()
        assert (status, outputs(body)) == (200, [2.0])
    finally:
        wire.close()
        ours.close()
        theirs.close()


# -- the connection limit --------------------------------------------------------------------

MAX_CONNECTIONS = 8


def _connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=STATE_DEADLINE_S)


@pytest.fixture(scope="module")
def few_connections(good_repository: Path) -> Iterator[RunningServer]:
    limits = Limits(max_connections=MAX_CONNECTIONS, keep_alive_timeout_s=60, body_timeout_s=60)
    with run_server(good_repository, limits=limits) as running:
        yield running


def _served_until(server: RunningServer, value: float) -> None:
    """New connections are served as before (once the server has closed the old ones)."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while True:
        wire = Wire(server)
        wire.send(infer_request([value]))
        status, _, body = wire.response()
        wire.close()
        if status == 200:
            assert outputs(body) == [value]
            return
        assert time.monotonic() < deadline, "the server kept refusing connections"


def test_at_the_connection_limit_the_oldest_idle_connection_makes_room(
    few_connections: RunningServer,
) -> None:
    idle = []
    for _ in range(MAX_CONNECTIONS):  # each served once, then idle (keep-alive)
        wire = Wire(few_connections)
        wire.send(b"GET /v2/health/live HTTP/1.1\r\nhost: t\r\n\r\n")
        assert wire.response()[0] == 200
        idle.append(wire)
    newcomer = Wire(few_connections)
    newcomer.send(infer_request([5.0]))
    status, headers, body = newcomer.response()
    assert (status, outputs(body)) == (200, [5.0])
    assert headers.get("connection") != "close"
    newcomer.close()
    idle[0].sock.settimeout(STATE_DEADLINE_S)
    assert idle[0]._fill() is False  # the oldest idle one was closed for it
    for wire in idle:
        wire.close()
    _served_until(few_connections, 5.5)


def test_when_every_connection_is_busy_health_is_answered_and_the_rest_refused(
    few_connections: RunningServer,
) -> None:
    busy = []
    for _ in range(MAX_CONNECTIONS):  # each sending a body: serving a request, not idle
        wire = Wire(few_connections)
        wire.send(HEAD + b"content-length: 1000\r\n\r\n{")
        busy.append(wire)
    # Past the limit: health probes are answered, once per connection ...
    deadline = time.monotonic() + STATE_DEADLINE_S
    while True:
        probe = Wire(few_connections)
        probe.send(b"GET /v2/health/ready HTTP/1.1\r\nhost: t\r\n\r\n")
        status, headers, _ = probe.response()
        probe.close()
        assert status == 200
        if headers.get("connection") == "close":
            break  # a reserved connection (until then, the busy ones were still arriving)
        assert time.monotonic() < deadline, "the busy connections were never counted"
    # ... and anything else is refused at once, naming the limit.
    other = Wire(few_connections)
    other.send(infer_request([1.0]))
    refused(other, 429, "--max-connections")
    # Past the reserve too: refused before anything is read.
    reserve = [_connect(few_connections) for _ in range(HEALTH_RESERVE)]
    late = Wire(few_connections)
    refused(late, 429, f"the server has {MAX_CONNECTIONS} connections open")
    for sock in reserve:
        sock.close()
    for wire in busy:
        wire.close()
    _served_until(few_connections, 6.0)


def test_blank_lines_do_not_keep_a_connection_open(limited: RunningServer) -> None:
    wire = Wire(limited)
    wire.send(b"\r\n\r\n")  # bytes, but no request
    wire.sock.settimeout(STATE_DEADLINE_S)
    assert wire._fill() is False
    wire.close()
