"""A front end's HTTP routes other than infer: passed as they are to the engine's own HTTP
app (the single server's routes, on a unix socket), the answer streamed back.

Health, metadata, configuration, the repository API, routing, statistics, shared-memory
registration, trace and log settings, generate and generate_stream: the engine answers
each exactly as one process does, because it is the one process's code. None of them is
on the hot path; the infer route never comes here (it takes the hop, engine/engine_client.py).
While the engine is away every route answers 503 at once, readiness included; liveness is
the front end's own (it is alive, and restarting it would not bring the engine back).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httptools
import orjson
from starlette.types import Receive, Scope, Send

from inferd.errors import InferdError
from inferd.protocol.http.error_responses import http_error
from inferd.protocol.http.infer_route import read_body

ENGINE_GONE = "the engine process is restarting; retry in a moment"
# Per connection, not per message: the proxy sets its own.
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"expect", b"te"}
)
_END = b""


class _Upstream(asyncio.Protocol):
    """One request's connection to the engine, parsing the response as it arrives."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: asyncio.Queue[bytes | None] = asyncio.Queue()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.connection_lost(None)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if not self.head.done():
            self.head.set_result(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.body.put_nowait(bytes(body))

    def on_message_complete(self) -> None:
        self.body.put_nowait(_END)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ConnectionError(ENGINE_GONE))
        self.body.put_nowait(None)  # cut short (a normal end came before, as _END)


class HttpProxy:
    """An ASGI app: every request to the engine's HTTP app at `path`."""

    def __init__(self, path: Path, max_request_bytes: int) -> None:
        self.path = path
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return None
        if scope["path"] == "/v2/health/live":
            return await _reply(send, 200, b"", [])
        headers = dict(scope["headers"])
        try:
            body = await read_body(
                receive, _latin(headers.get(b"content-length")), self.max_request_bytes
            )
        except InferdError as exc:
            error = http_error(exc)
            json = (b"content-type", b"application/json")
            return await _reply(send, error.status, error.body, [json, *error.headers])
        loop = asyncio.get_running_loop()
        try:
            transport, upstream = await loop.create_unix_connection(_Upstream, str(self.path))
        except OSError:
            return await _engine_gone(send)
        try:
            target = scope.get("raw_path") or scope["path"].encode()
            if scope.get("query_string"):
                target += b"?" + scope["query_string"]
            head = [b"%s %s HTTP/1.1\r\n" % (scope["method"].encode(), target)]
            head += [b"%s: %s\r\n" % kv for kv in scope["headers"] if kv[0] not in _HOP_BY_HOP]
            head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
            transport.write(b"".join(head) + body)
            try:
                status = await upstream.head
            except ConnectionError:
                return await _engine_gone(send)
            response_headers = [kv for kv in upstream.headers if kv[0] not in _HOP_BY_HOP]
            length = next((v for k, v in upstream.headers if k == b"content-length"), None)
            if length is not None:
                response_headers.append((b"content-length", length))
            await send(
                {"type": "http.response.start", "status": status, "headers": response_headers}
            )
            # A client that leaves mid-answer (a generate_stream it stops reading) closes the
            # engine's connection too: the engine ends the stream instead of finishing it.
            watcher = asyncio.create_task(_close_on_disconnect(receive, transport))
            try:
                await _relay(upstream, send)
            finally:
                watcher.cancel()
        finally:
            transport.close()


async def _relay(upstream: _Upstream, send: Send) -> None:
    while True:
        chunk = await upstream.body.get()
        if not chunk:  # the end (_END), or the engine went away mid-answer (None)
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _close_on_disconnect(receive: Receive, transport: asyncio.BaseTransport) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    transport.close()


def _latin(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def _engine_gone(send: Send) -> None:
    body = orjson.dumps({"error": ENGINE_GONE})
    await _reply(send, 503, body, [(b"content-type", b"application/json")])


async def _reply(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
