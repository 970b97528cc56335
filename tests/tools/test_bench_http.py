"""inferd bench's lean HTTP/1.1 load client: request bytes, response framing, outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from inferd_tools.bench.http import HttpConnection, HttpError, build_request
from inferd_tools.bench.load import Load, LocalSource, Target


def test_request_is_built_once_with_host_length_and_headers() -> None:
    data = build_request(
        "http://127.0.0.1:8000/prefix/",
        "/v2/models/m/infer",
        b"abc",
        {"Inference-Header-Content-Length": "3", "Content-Length": "999"},
    )
    head, _, body = data.partition(b"\r\n\r\n")
    assert body == b"abc"
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /prefix/v2/models/m/infer HTTP/1.1"
    assert b"Host: 127.0.0.1:8000" in lines and b"Content-Length: 3" in lines
    assert b"Inference-Header-Content-Length: 3" in lines and b"Content-Length: 999" not in lines


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def _connection() -> tuple[HttpConnection, _Transport]:
    conn = HttpConnection()
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


CL = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = (
    b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"4\r\nerr \r\n7;x=1\r\nmessage\r\n0\r\n\r\n"
)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"


@pytest.mark.parametrize(("response", "status"), [(CL, 200), (CHUNKED, 400), (CONTINUE, 204)])
@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_responses_are_framed_in_any_pieces(response: bytes, status: int, piece: int) -> None:
    async def go() -> None:
        conn, transport = _connection()
        for _ in range(2):  # keep-alive: the same connection again
            waiter = conn.request(b"REQ")
            for i in range(0, len(response), piece):
                assert not waiter.done()
                conn.data_received(response[i : i + piece])
            assert waiter.done() and waiter.result() == status
            assert not conn.busy and not transport.closed

    asyncio.run(go())


def test_body_until_close_and_connection_close() -> None:
    async def go() -> None:
        conn, transport = _connection()
        waiter = conn.request(b"REQ")
        conn.data_received(b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy")
        assert not waiter.done()
        conn.connection_lost(None)
        assert waiter.result() == 503 and conn.closed

        conn, transport = _connection()
        waiter = conn.request(b"REQ")
        conn.data_received(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
        assert waiter.result() == 200 and conn.closed and transport.closed

    asyncio.run(go())


@pytest.mark.parametrize(
    "event",
    [
        lambda c: c.connection_lost(ConnectionResetError("reset")),
        lambda c: (
            c.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")
            or c.connection_lost(None)
        ),
        lambda c: c.data_received(b"SSH-2.0-OpenSSH\r\n\r\n"),
    ],
)
def test_broken_responses_fail_the_request(event: Callable[[HttpConnection], None]) -> None:
    async def go() -> None:
        conn, _ = _connection()
        waiter = conn.request(b"REQ")
        event(conn)
        with pytest.raises(HttpError):
            waiter.result()

    asyncio.run(go())


_WRITERS: list[asyncio.StreamWriter] = []


async def _close_all(server: asyncio.Server) -> None:
    server.close()
    for writer in _WRITERS:
        writer.close()
    _WRITERS.clear()
    await asyncio.sleep(0.01)


async def _serve(handler: Callable[[bytes], bytes | None]) -> tuple[asyncio.Server, int]:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _WRITERS.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                reply = handler(head)
                if reply is None:
                    writer.close()
                    return
                if reply:
                    writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _target(port: int, timeout_s: float = 60.0) -> Target:
    return Target(
        "http", f"http://127.0.0.1:{port}", "m", "", (b'{"inputs": []}',), ({},), timeout_s
    )


def test_outcomes_over_real_connections() -> None:
    """Statuses count as they are; a dropped connection, a refused one and a silent server
    count as connection_error and timeout; keep-alive connections are reused."""

    async def go() -> None:
        seen: list[bytes] = []

        def handler(head: bytes) -> bytes | None:
            seen.append(head)
            if len(seen) % 3 == 0:
                return None  # drop the connection
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

        server, port = await _serve(handler)
        source = LocalSource(_target(port))
        await source.open()
        for _ in range(6):
            assert await source._send_http() in ("200", "connection_error")
        await source.close()
        assert source.samples.sent == 0  # only the load loops count sends
        await _close_all(server)
        assert seen[0].startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")

        silent, port = await _serve(lambda head: b"")
        source = LocalSource(_target(port, timeout_s=0.2))
        await source.open()
        assert await source._send_http() == "timeout"
        await source.close()
        await _close_all(silent)

        source = LocalSource(_target(port))  # nobody listens there now
        await source.open()
        assert await source._send_http() == "connection_error"
        await source.close()

    asyncio.run(go())


def test_closed_loop_keeps_one_connection_per_slot() -> None:
    async def go() -> None:
        connections = 0

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            _WRITERS.append(writer)
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(len(b'{"inputs": []}'))
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(client, "127.0.0.1", 0)
        source = LocalSource(_target(server.sockets[0].getsockname()[1]))
        await source.open()
        await source.start(Load(concurrency=4))
        await asyncio.sleep(0.3)
        samples = await source.stop()
        await source.close()
        await _close_all(server)
        assert samples.successes > 20 and not samples.errors
        assert connections == 4

    asyncio.run(go())
