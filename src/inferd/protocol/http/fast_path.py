"""uvicorn's HTTP/1.1 protocol with the infer route answered straight from the parser.

A profile of small requests at 64 connections put uvicorn's per-request machinery (an ASGI
scope, a request/response cycle with its event, a task per request and a second one to
watch for disconnects, the proxy-headers middleware, two socket writes per response) at
about as much CPU as inferd's own work. For `POST .../infer` this protocol skips all of it:
it collects the body as the parser delivers it, runs `InferEndpoint.respond` in one task,
and writes the status line, headers and body with one `write`. A disconnect cancels that
task directly (the request leaves its queue unexecuted, as on the ASGI path; as in uvicorn,
a request pipelined behind another is not watched while reading is paused for it). A body
over the size limit is refused (413, then the connection closes) as soon as its declared
length or the bytes received pass the limit.

Below it, parser_guard.py bounds what a client controls (head size, timeouts, connections).
Everything else stays uvicorn's: the listening socket, keep-alive, graceful shutdown
(the task is in `server_state.tasks`, which uvicorn waits for), every other route through
ASGI, and pipelined requests (an infer request arriving while another response is pending
takes the ASGI path, so responses keep their order). uvicorn documents `http=` as taking a
protocol class; what this subclass touches of `HttpToolsProtocol` is covered by the
HTTP tests, which all run through it.
"""

from __future__ import annotations

import asyncio
import http
import logging

import httptools

from inferd.errors import ErrorKind, InferdError
from inferd.limits import Limits
from inferd.protocol.http.error_responses import INTERNAL_BODY
from inferd.protocol.http.infer_route import _JSON, InferEndpoint, Reply
from inferd.protocol.http.parser_guard import ConnectionBook, GuardedHttpProtocol

log = logging.getLogger("inferd.http")

_STATUS_LINE = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_JOIN_BELOW = 1 << 16  # bodies smaller than this go out in one write with their head


class _InferCall:
    """One infer request on a connection. It stands where uvicorn keeps its
    request/response cycle, so uvicorn's shutdown and pipelining checks read it as one
    (`response_complete`, `keep_alive`)."""

    __slots__ = (
        "body",
        "declared",
        "disconnected",
        "headers",
        "keep_alive",
        "model",
        "response_complete",
        "size",
        "task",
        "version",
    )

    def __init__(self, model: str, version: str, headers: dict[str, str], keep_alive: bool):
        self.model = model
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.body: list[bytes] = []
        self.size = 0
        self.declared = False  # refused for its declared length, before its body
        self.response_complete = False
        self.disconnected = False
        self.task: asyncio.Task[None] | None = None

    @property
    def response_started(self) -> bool:
        return self.task is not None  # (uvicorn's cycle has it too: the guard reads either)


class InferdHttpProtocol(GuardedHttpProtocol):
    endpoint: InferEndpoint  # set on the subclass `protocol_class` makes

    peer = ""  # the client's host:port, for logs

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.peer = f"{self.client[0]}:{self.client[1]}" if self.client else ""

    # -- parser callbacks ---------------------------------------------------------------

    def on_request_head(self) -> None:
        parser = self.parser
        if (
            parser.get_method() == b"POST"
            and (self.cycle is None or self.cycle.response_complete)
            and self.limit_concurrency is None
            and not parser.should_upgrade()
        ):
            path = httptools.parse_url(self.url).path
            target = None if b"%" in path else InferEndpoint.match(path.decode("ascii"))
            if target is not None:
                keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
                call = _InferCall(*target, self.endpoint.pick_headers(self.headers), keep_alive)
                self.cycle = call  # type: ignore[assignment]
                declared = call.headers.get("length", "")
                if declared.isdecimal() and int(declared) > self.endpoint.max_request_bytes:
                    # Refused before its body arrives (413 now, not after gigabytes); the
                    # unread body makes the connection unusable, so it closes after.
                    call.size, call.declared = int(declared), True
                    call.keep_alive = False
                    self._start(call)
                elif self.expect_100_continue:
                    self.transport.write(_CONTINUE)
                return
        super().on_request_head()

    def on_body(self, body: bytes) -> None:
        call: object = self.cycle
        if type(call) is not _InferCall:
            return super().on_body(body)
        if call.task is not None:
            return None  # refused already: the rest is dropped unread
        call.size += len(body)
        if call.size <= self.endpoint.max_request_bytes:
            call.body.append(body)
        else:  # a body without a (truthful) length passed the limit: refuse it now
            call.body.clear()
            call.keep_alive = False
            self._start(call)
        return None

    def on_request_end(self) -> None:
        call: object = self.cycle
        if type(call) is not _InferCall:
            return super().on_request_end()
        if call.task is None:  # else refused already, at its headers
            self._start(call)
        return None

    def _start(self, call: _InferCall) -> None:
        task = self.loop.create_task(self._answer(call))
        call.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        call: object = self.cycle
        if type(call) is _InferCall:
            self.cycle = None  # type: ignore[assignment]
            if not call.response_complete:
                call.disconnected = True
                if call.task is not None:
                    call.task.cancel()  # the queued request is removed unexecuted
        super().connection_lost(exc)

    # -- the request ---------------------------------------------------------------------

    async def _answer(self, call: _InferCall) -> None:
        async def read() -> bytes:
            limit = self.endpoint.max_request_bytes
            if call.size > limit:
                what = f"request body of {call.size} bytes" if call.declared else "request body"
                raise InferdError(
                    ErrorKind.PAYLOAD_TOO_LARGE, f"{what} exceeds the limit of {limit} bytes"
                )
            return call.body[0] if len(call.body) == 1 else b"".join(call.body)

        try:
            reply = await self.endpoint.respond(
                call.model, call.version, call.headers, self.peer, read
            )
        except asyncio.CancelledError:
            if not call.disconnected:
                raise  # the server is stopping
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return  # nobody is listening any more
        except Exception:
            log.exception("unhandled error on POST /v2/models/%s/infer", call.model)
            call.keep_alive = False
            reply = (500, _JSON, INTERNAL_BODY, [])
        if call.disconnected:
            return
        if self.flow.write_paused:
            await self.flow.drain()
            if call.disconnected:
                return
        head, body = self._head(reply, call.keep_alive), reply[2]
        if len(body) < _JOIN_BELOW:
            self.transport.write(head + body)  # one write: one send for a small answer
        else:  # no copy of a large body on the loop to put its head in front
            self.transport.write(head)
            self.transport.write(body)
        call.response_complete = True
        if not call.keep_alive:
            self.transport.close()
        self.on_response_complete()

    def _head(self, reply: Reply, keep_alive: bool) -> bytes:
        status, content_type, body, extra = reply
        lines = [_STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:  # date, server
            lines += (name, b": ", value, b"\r\n")
        lines += (b"content-type: ", content_type, b"\r\ncontent-length: ")
        lines += (str(len(body)).encode(), b"\r\n")
        for name, value in extra:
            lines += (name, b": ", value, b"\r\n")
        if not keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)


def protocol_class(endpoint: InferEndpoint, limits: Limits) -> type[InferdHttpProtocol]:
    """The protocol class to give uvicorn (`http=`), bound to this server's endpoint and
    limits."""
    attributes = {"endpoint": endpoint, "limits": limits, "book": ConnectionBook()}
    return type("InferdHttp", (InferdHttpProtocol,), attributes)
