"""uvicorn's httptools protocol with a bound on everything one HTTP client controls.

httptools has no limits of its own and uvicorn adds few: one connection sending one endless
header value froze every other client for 21 s (httptools gathers a value by concatenation
until it ends); many headers grew the server to 3 GB; a connection that sends nothing, or
half a request, stayed open for ever (19,990 of them took every file descriptor, and health
checks failed). This class, under the infer fast path (fast_path.py), bounds:

- the request head: its bytes as they arrive (the parser is fed no more of an unfinished
  head than the limit), its header fields and the URL (431 / 414);
- time: a request's head must arrive within `header_timeout_s` of its first byte, its body
  may not pause longer than `body_timeout_s` (408); an idle connection, before its first
  request as between requests, closes after `keep_alive_timeout_s`;
- connections: at `max_connections`, a new connection closes the oldest one that serves no
  request (idle, or still sending its head: how an idle or slowloris flood loses its hold);
  when every one is serving, HEALTH_RESERVE more are let in for /v2/health/* (anything else
  on them gets 429); past those, a new connection gets 429 and is closed.

A refusal is a JSON error naming the limit and its option, then the connection closes: its
write side at once, its read side after the client has read the answer (what it still
sends is dropped unparsed), so the answer is not lost to a reset. The checks on the hot path
are a few integer comparisons per read and per header; a timer is armed only for a head or
body that spans reads.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import time
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from inferd.limits import DEFAULT_LIMITS, HEALTH_RESERVE, KIB, Limits
from inferd.protocol.http.error_responses import RETRY_AFTER

log = logging.getLogger("inferd.http")

LINGER_S = 2.0  # how long a refused connection's read side stays open for the answer
HEALTH_PREFIX = b"/v2/health/"
WARN_EVERY_S = 10.0  # refused connections are logged at most this often


class _Phase(enum.Enum):
    IDLE = 0  # no request being read (none yet, or one being answered)
    HEAD = 1
    BODY = 2


class _RefusedError(Exception):
    """Raised in a parser callback to stop the parser; the answer is in `_refusal`."""


class ConnectionBook:
    """One server's connections that serve no request now, oldest first, and how many of
    them are being closed to make room (they count as open until the loop has closed them)."""

    def __init__(self) -> None:
        self.idle: dict[GuardedHttpProtocol, None] = {}
        self.closing = 0


class GuardedHttpProtocol(HttpToolsProtocol):
    # The class protocol_class makes sets both, one of each per server.
    limits: Limits = DEFAULT_LIMITS
    book: ConnectionBook = ConnectionBook()

    _refused_connections = 0  # since the last warning, across connections
    _last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_timeout_s  # type: ignore[assignment]
        self._phase = _Phase.IDLE
        self._head_bytes = 0  # bytes read since the current head began
        self._header_fields = 0
        self._header_field_bytes = 0
        self._heads_done = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase = _Phase.IDLE
        self._last_read = 0.0
        self._refusal: tuple[int, str] | None = None
        self._discarding = False
        self._reserve = False  # admitted past max_connections: health probes only
        self._evicted = False

    # -- connections ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        limits, book = self.limits, self.book
        open_now = len(self.connections) - book.closing
        if open_now > limits.max_connections and book.idle:
            # Make room: the connection idle the longest goes (as a keep-alive timeout would).
            victim = next(iter(book.idle))
            del book.idle[victim]
            victim._evicted = True
            book.closing += 1
            victim.transport.close()
            open_now -= 1
        if open_now > limits.max_connections:
            self._reserve = True
            if open_now > limits.max_connections + HEALTH_RESERVE:
                self._warn_refused()
                self.transport.write(self._error(429, self._busy_message()))
                self.transport.close()
                return
        else:
            book.idle[self] = None
        # Idle until the first request as between requests: uvicorn arms this timer only
        # after a response, so a connection that never sent anything stayed open for ever.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.book.idle.pop(self, None)
        if self._evicted:
            self._evicted = False
            self.book.closing -= 1
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle: Any = self.cycle
        if (
            not self._reserve
            and (cycle is None or cycle.response_complete)
            and not self.transport.is_closing()
        ):
            self.book.idle[self] = None  # serving nothing again: the newest idle one

    def timeout_keep_alive_handler(self) -> None:
        """The keep-alive timeout passed: close, unless the client's next request is already
        here, unread. After the loop stalled past the timeout while handling other events (a
        long collection, a starved CPU), uvloop runs the timers that fell due before it reads
        the sockets again: closing then reset a connection whose client sent in time."""
        if self.transport.is_closing():
            return
        if _has_unread_bytes(self.transport):
            self.timeout_keep_alive_task = None  # reading them arms whichever timer applies
            return
        super().timeout_keep_alive_handler()

    def _busy_message(self) -> str:
        return (
            f"the server has {self.limits.max_connections} connections open "
            "(--max-connections); retry later"
        )

    def _warn_refused(self) -> None:
        cls = GuardedHttpProtocol
        cls._refused_connections += 1
        now = time.monotonic()
        if now - cls._last_warning >= WARN_EVERY_S:
            log.warning(
                "refused %d HTTP connections past --max-connections %d (+%d for health probes)",
                cls._refused_connections,
                self.limits.max_connections,
                HEALTH_RESERVE,
            )
            cls._refused_connections, cls._last_warning = 0, now

    # -- reading ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._discarding:
            return  # refused: what the client still sends is dropped unparsed
        if self._phase is not _Phase.BODY:
            room = self.limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Feed no more of a head than the limit: it must end within those bytes.
                heads, view = self._heads_done, memoryview(data)
                if not self._feed(view[: max(room, 0)]):
                    return
                if self._heads_done == heads:
                    self._refuse(431, self._head_too_large())
                    return
                self._feed_and_time(view[max(room, 0) :])
                return
            self._head_bytes += len(data)
        self._feed_and_time(data)

    def _feed_and_time(self, data: bytes | memoryview) -> None:
        if not self._feed(data):
            return
        phase = self._phase
        if phase is _Phase.IDLE:
            if self._timer is not None:
                self._cancel_timer()
            cycle: Any = self.cycle
            if (cycle is None or cycle.response_complete) and self.timeout_keep_alive_task is None:
                # Bytes that began no request (blank lines): the connection is still idle.
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
            return
        if phase is _Phase.BODY:
            self._last_read = self.loop.time()
        if self._timer is None or self._timer_phase is not phase:
            # A head or body spanning reads: from now, it has its time limit.
            self._cancel_timer()
            limits = self.limits
            delay = limits.header_timeout_s if phase is _Phase.HEAD else limits.body_timeout_s
            self._timer = self.loop.call_later(delay, self._read_timeout)
            self._timer_phase = phase

    def _feed(self, data: bytes | memoryview) -> bool:
        """Parse `data`; False once this connection reads no more (refused, malformed)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self._refusal is None:
                raise
            self._refuse(*self._refusal)
            return False
        except httptools.HttpParserError:
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
            return False
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        return True

    def _read_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        limits, phase = self.limits, self._phase
        if phase is _Phase.BODY:
            quiet = self.loop.time() - self._last_read
            if self.flow.read_paused or quiet < limits.body_timeout_s:
                # Data came meanwhile, or the server itself paused reading: wait again.
                wait = limits.body_timeout_s - (0.0 if self.flow.read_paused else quiet)
                self._timer = self.loop.call_later(max(wait, 0.001), self._read_timeout)
                self._timer_phase = phase
                return
            self._refuse(
                408,
                f"request body stalled: nothing received for {limits.body_timeout_s:g} s "
                "(--body-timeout-secs)",
            )
        elif phase is _Phase.HEAD:
            if not self._can_answer():
                # A pipelined head behind a response still being made: its turn comes later.
                self._timer = self.loop.call_later(limits.header_timeout_s, self._read_timeout)
                self._timer_phase = phase
                return
            self._refuse(
                408,
                f"request headers not received within {limits.header_timeout_s:g} s "
                "(--header-timeout-secs)",
            )

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- parser callbacks ------------------------------------------------------------------

    # on_message_begin, on_url and on_header do what uvicorn's do (their state, checked by
    # tests/unit/protocol/test_uvicorn_internals.py) without calling them: per header, one
    # Python call instead of two; and the ASGI scope uvicorn builds for every request is
    # built only for a request that takes the ASGI path (`on_request_head`).

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._phase = _Phase.HEAD
        self._header_fields = self._header_field_bytes = 0

    def asgi_scope(self) -> Any:
        """The scope uvicorn's on_message_begin makes for the request being read."""
        return {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.limits.max_url_bytes:
            self._stop(
                414,
                f"request URL longer than {self.limits.max_url_bytes} bytes (--max-url-kib)",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.limits
        self._header_fields += 1
        self._header_field_bytes += len(name) + len(value)
        if self._header_fields > limits.max_header_count:
            self._stop(
                431,
                f"request has more than {limits.max_header_count} header fields "
                "(--max-header-count)",
            )
        if self._header_field_bytes + len(self.url) > limits.max_header_bytes:
            self._stop(431, self._head_too_large())
        name = name.lower()
        # llhttp keeps trailing whitespace, which RFC 9110 section 5.5 excludes from a value.
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    # Subclasses override on_request_head and on_request_end, never the two callbacks they
    # are called from, whose bookkeeping must run for every request.

    def on_headers_complete(self) -> None:
        self._heads_done += 1
        self._phase = _Phase.BODY
        self.book.idle.pop(self, None)  # serving a request: not to be closed for room
        if self._reserve:
            path = httptools.parse_url(self.url).path
            if self.parser.get_method() != b"GET" or not path.startswith(HEALTH_PREFIX):
                self._stop(429, self._busy_message())
        if self.parser.should_upgrade() and not self._should_upgrade() and self._has_body():
            # The parser hands everything after the head of an upgrade request to the new
            # protocol: its body would be lost and the request served empty (curl --http2
            # on an http:// URL offers h2c). Refused, naming the way that works.
            self._stop(
                400,
                "HTTP upgrade requests with a body are not served (the body would be lost): "
                "send it over HTTP/1.1 without 'Upgrade' (curl: --http1.1), or use gRPC",
            )
        self.on_request_head()
        if self._reserve and self.cycle is not None:
            self.cycle.keep_alive = False  # a reserved connection serves one probe

    def _has_body(self) -> bool:
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                return True
        return False

    def on_request_head(self) -> None:
        """A request's head is in and within its limits: route it (uvicorn's ASGI path)."""
        self.scope = self.asgi_scope()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _Phase.IDLE
        self._head_bytes = 0
        self.on_request_end()

    def on_request_end(self) -> None:
        """A request's body is in (uvicorn's ASGI path)."""
        super().on_message_complete()

    def _head_too_large(self) -> str:
        size = self.limits.max_header_bytes
        shown = f"{size // KIB} KiB" if size % KIB == 0 else f"{size} bytes"
        return f"request headers exceed {shown} (--max-header-kib)"

    # -- refusing --------------------------------------------------------------------------

    def _stop(self, status: int, message: str) -> None:
        """From a parser callback: stop parsing; data_received answers the refusal."""
        self._refusal = (status, message)
        raise _RefusedError(message)

    def _can_answer(self) -> bool:
        """No earlier response is pending on this connection (answers keep their order)."""
        cycle: Any = self.cycle
        return cycle is None or cycle.response_complete or not cycle.response_started

    def _refuse(self, status: int, message: str) -> None:
        self._phase = _Phase.IDLE
        self._cancel_timer()
        transport = self.transport
        if transport.is_closing():
            return
        if not self._can_answer():
            transport.close()  # a response is under way: nothing can be said in order
            return
        transport.write(self._error(status, message))
        # Close the write side now and the read side once the client has read the answer
        # (or LINGER_S later): closing both with unread data would reset the connection,
        # and the client could lose the answer.
        self._discarding = True
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    def _error(self, status: int, message: str) -> bytes:
        body = orjson.dumps({"error": message})
        lines = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            lines += (name, b": ", value, b"\r\n")
        lines.append(b"content-type: application/json\r\n")
        if status == 429:  # as every shed answer (error_responses.py)
            lines += (RETRY_AFTER[0], b": ", RETRY_AFTER[1], b"\r\n")
        lines += (b"content-length: ", str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n")
        lines.append(body)
        return b"".join(lines)


def _has_unread_bytes(transport: asyncio.BaseTransport) -> bool:
    """Whether the connection's socket holds received bytes the loop has not read yet: a
    peek on a duplicate of its descriptor (uvloop's transports expose no socket to read
    from), nothing consumed. Only a keep-alive timeout asks, never a request."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with socket.socket(fileno=os.dup(sock.fileno())) as peek:
            return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError: nothing to read; anything else: nothing to keep
        return False
