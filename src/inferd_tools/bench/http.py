"""A lean HTTP/1.1 client for the load path: one keep-alive connection per concurrent
request, an `asyncio.Protocol` each, sending a request pre-built once as bytes (request
line, headers and body) and parsing the response only as far as a load generator needs:
the status, and where the body ends (Content-Length, chunked, or the connection closing).
A success's body is read and dropped, never decoded (binary `Inference-Header-Content-Length`
bodies are just bytes here); an error's first bytes are kept, since they hold its message.

aiohttp costs about 260 µs of client CPU per request on uvloop, which at concurrency 1 sits
in series with every request's latency; this path costs a fraction of that.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from urllib.parse import urlsplit

_MAX_HEAD = 1 << 16  # a response head longer than this is not HTTP we understand
_MAX_ERROR_BODY = 1024  # bytes kept of an error response's body: enough for its message


class HttpError(Exception):
    """The connection failed, closed mid-response, or the response was not valid HTTP/1.x."""


def build_request(address: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """`POST path` to http(s)://host:port[/prefix] as bytes, keep-alive, with `body`."""
    url = urlsplit(address)
    host = url.netloc.rsplit("@", 1)[-1]
    lines = [
        f"POST {url.path.rstrip('/')}{path} HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
    ]
    skip = {"host", "content-length", "connection", "transfer-encoding"}
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in skip]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def endpoint(address: str) -> tuple[str, int, ssl.SSLContext | None]:
    url = urlsplit(address)
    if url.scheme not in ("http", "https"):
        raise ValueError(f"{address!r}: expected an http:// or https:// address")
    secure = url.scheme == "https"
    return (
        url.hostname or "127.0.0.1",
        url.port or (443 if secure else 80),
        (ssl.create_default_context() if secure else None),
    )


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection, one request at a time (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.started = 0.0  # perf_counter at the last send, while `busy` (for timeouts)
        self.busy = False
        self._waiter: asyncio.Future[int] | None = None
        self._head = b""
        self._status = 0  # 0: reading the head
        self._remaining = 0  # body bytes left (Content-Length mode)
        self._mode = 0  # 0: Content-Length, 1: chunked, 2: until the connection closes
        self._chunked = bytearray()
        self._keep_alive = True
        # The start of the last response's body when its status is not 2xx (see error_body);
        # `_failing` says the response being read is such a one.
        self._error_body = bytearray()
        self._failing = False

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._status and self._mode == 2:
            self._finish()  # the body ran until the connection closed
        else:
            self._fail(HttpError(str(exc) if exc else "the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            return  # nothing asked for (no pipelining): ignore
        try:
            self._feed(data)
        except HttpError as e:
            self._fail(e)
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost settles the request

    # --- use ---------------------------------------------------------------------------

    def request(self, data: bytes) -> asyncio.Future[int]:
        """Send `data` (a whole request); the future resolves to the response's status."""
        assert self.transport is not None and self._waiter is None
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._error_body.clear()
        self.busy = True
        self.started = time.perf_counter()
        self.transport.write(data)
        return waiter

    @property
    def error_body(self) -> bytes:
        """The first bytes of the last response's body if its status was not 2xx, else b"".
        Valid once the request's future is done, until the next request."""
        return bytes(self._error_body)

    def timed_out(self) -> None:
        self._fail(TimeoutError())
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- parsing -----------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if not self._status:
            if self._head:
                data = self._head + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > _MAX_HEAD:
                    raise HttpError("response head too long")
                self._head = data
                return
            self._head = b""
            self._parse_head(data[:end])
            data = data[end + 4 :]
            if not self._status:  # 1xx: informational, the real response follows
                if data:
                    self._feed(data)
                return
            if self._mode == 0 and self._remaining == 0:
                self._finish()
                return
        if self._mode == 0:
            if self._failing:  # only an error's body is copied: successes stay cheap
                self._keep_error(data[: self._remaining])
            self._remaining -= len(data)
            if self._remaining <= 0:
                self._finish()
        elif self._mode == 1:
            self._chunked += data
            if self._chunks_done():
                self._finish()
        elif self._failing:  # mode 2: the body runs until connection_lost
            self._keep_error(data)

    def _keep_error(self, body: bytes | bytearray) -> None:
        room = _MAX_ERROR_BODY - len(self._error_body)
        if room > 0:
            self._error_body += body[:room]

    def _parse_head(self, head: bytes) -> None:
        if not head.startswith(b"HTTP/1."):
            raise HttpError(f"not an HTTP/1.x response: {head[:40]!r}")
        try:
            status = int(head[9:12])
        except ValueError:
            raise HttpError(f"bad status line: {head[:40]!r}") from None
        lower = head.lower()
        http10 = head[7:8] == b"0"
        self._keep_alive = not http10
        length = -1
        chunked = False
        for line in lower.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise HttpError("bad Content-Length") from None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                if b"close" in value:
                    self._keep_alive = False
                elif b"keep-alive" in value:
                    self._keep_alive = True
        if status < 200:
            return  # 1xx: `_status` stays 0
        self._status = status
        self._failing = not 200 <= status < 300
        if status in (204, 304):
            self._mode, self._remaining = 0, 0
        elif chunked:
            self._mode = 1
            self._chunked.clear()
        elif length >= 0:
            self._mode, self._remaining = 0, length
        else:
            self._mode = 2
            self._keep_alive = False

    def _chunks_done(self) -> bool:
        """Consume whole chunks from the buffer; True once the last chunk and trailers are in."""
        buf = self._chunked
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                return False
            try:
                size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
            except ValueError:
                raise HttpError("bad chunk size") from None
            if size == 0:
                # trailers (usually none) end with an empty line
                return buf.find(b"\r\n\r\n", eol) >= 0
            if len(buf) < eol + 2 + size + 2:
                return False
            if self._failing:
                self._keep_error(buf[eol + 2 : eol + 2 + size])
            del buf[: eol + 2 + size + 2]

    def _finish(self) -> None:
        waiter, status = self._waiter, self._status
        self._reset()
        if not self._keep_alive:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(status)

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        self._reset()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _reset(self) -> None:
        self._waiter = None
        self.busy = False
        self._status = 0
        self._failing = False
        self._head = b""
        self._mode = 0
        self._remaining = 0
        self._chunked.clear()
