"""The HTTP infer route, `POST /v2/models/{m}[/versions/{v}]/infer`, below any HTTP
server's request objects (protocol/http/fast_path.py calls it from the parser, app.py from ASGI)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from inferd.dataplane.access import ApiGroup
from inferd.dataplane.unary_plane import UnaryPlane
from inferd.errors import ErrorKind, InferdError
from inferd.events import CallContext
from inferd.limits import DEFAULT_LIMITS
from inferd.protocol.http.error_responses import http_error
from inferd.protocol.http.rest_codec import decode_request, encode_response
from inferd.protocol.offload import Offload
from inferd.protocol.strict_values import TIMEOUT_MS, deadline_ns, header_length
from inferd.telemetry import tracing
from inferd.types import InferRequest, min_wire_bytes

HEADER_LENGTH = "inference-header-content-length"
ROUTING_KEY = "inferd-routing-key"  # makes canary routing sticky
_JSON = b"application/json"
_BINARY = b"application/octet-stream"
# The request headers the infer route reads, and where each goes.
_HEADERS = {
    b"content-length": "length",
    HEADER_LENGTH.encode(): "header_length",
    b"traceparent": "traceparent",
    ROUTING_KEY.encode(): "routing_key",
    TIMEOUT_MS.encode(): "timeout_ms",
}


Reply = tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]  # status, type, body, headers
_CREDENTIAL = "credential:"  # field-name prefix of the headers a restricted infer reads


def pick_headers(
    pairs: list[tuple[bytes, bytes]], fields: dict[bytes, str] = _HEADERS
) -> dict[str, str]:
    """The headers the infer route reads, by field name, from (lower-case name, value)."""
    headers: dict[str, str] = {}
    for name, value in pairs:
        field = fields.get(name)
        if field is not None:
            headers[field] = value.decode("latin-1")
    return headers


class InferEndpoint:
    """`POST /v2/models/{m}[/versions/{v}]/infer`, below any HTTP server's request objects.

    `respond` is the route: headers and a body reader in, one DataPlane call, a reply out.
    Two transports call it: `InferdHttpProtocol` (protocol/http/fast_path.py) straight from the
    HTTP parser, and `__call__` as a plain ASGI callable for the rare requests that
    protocol hands to ASGI (pipelined ones). Both skip Starlette's routing and its
    Request/Response objects (about a tenth of a small request's cost in a profile).
    """

    def __init__(
        self,
        dataplane: UnaryPlane,
        max_request_bytes: int,
        offload: Offload | None = None,
        max_response_bytes: int = 0,
        max_bytes_elements: int = DEFAULT_LIMITS.max_bytes_elements,
    ) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes
        self.max_response_bytes = max_response_bytes
        self.max_bytes_elements = max_bytes_elements
        self.offload = offload or Offload(DEFAULT_LIMITS.offload_bytes)
        access = dataplane.access
        self.guarded = access.guards("http", ApiGroup.INFERENCE)
        # The headers to pick: the route's own, and those a restricted infer's credential
        # arrives in (only when `--http-restricted-api inference:...` is set).
        self.header_fields = dict(_HEADERS)
        for name in access.headers("http", ApiGroup.INFERENCE):
            self.header_fields[name.encode()] = _CREDENTIAL + name
        # pick_headers(pairs) with this route's fields: a partial, no Python frame of its own
        self.pick_headers: Callable[[list[tuple[bytes, bytes]]], dict[str, str]] = (
            functools.partial(pick_headers, fields=self.header_fields)
        )

    @staticmethod
    def match(path: str) -> tuple[str, str] | None:
        parts = path.split("/")
        n = len(parts)
        if n == 5 and parts[4] == "infer" and parts[1] == "v2" and parts[2] == "models":
            return parts[3], ""
        if (
            n == 7
            and parts[6] == "infer"
            and parts[1:3] == ["v2", "models"]
            and parts[4] == "versions"
        ):
            return parts[3], parts[5]
        return None

    async def respond(
        self,
        model: str,
        version: str,
        headers: dict[str, str],
        peer: str,
        read: Callable[[], Awaitable[bytes]],
        on_decoded: Callable[[], None] | None = None,
    ) -> Reply:
        """Answer one infer request. `read` gives the body (after admission: a shed request
        is refused unread); `on_decoded` runs once it is decoded."""
        start_ns = time.perf_counter_ns()
        ctx = CallContext(
            "http",
            peer,
            headers.get("traceparent", ""),
            time.time(),
            start_ns,
            headers.get("routing_key", ""),
        )
        extra: list[tuple[bytes, bytes]] = []
        if ctx.traceparent:  # echoed when valid; a request without one pays nothing here
            traceparent = tracing.echo(ctx)
            if traceparent:
                extra.append((b"traceparent", traceparent.encode()))

        try:
            if self.guarded:
                self.dp.access.check(
                    "http", ApiGroup.INFERENCE, lambda name: headers.get(_CREDENTIAL + name)
                )
            with self.dp.start(model, version, ctx) as call:
                self.dp.admit(call)
                threshold = self.offload.threshold_bytes
                try:
                    ctx.deadline_ns = deadline_ns(headers.get("timeout_ms"), start_ns)
                    json_length = header_length(headers.get("header_length"))  # before the body
                    body = await read()
                    # Small messages are decoded and encoded inline, without a coroutine per
                    # step (Offload.run's own threshold, compared here): most requests.
                    if len(body) >= threshold:  # a thread, or a process for large JSON
                        request = await self._decode(body, json_length, model, version)
                    else:
                        request = decode_request(
                            body, json_length, model, version, self.max_bytes_elements
                        )
                except InferdError as exc:  # admission first, as in one process
                    raise await self.dp.refusal(call, exc) from None
                if on_decoded is not None:
                    on_decoded()
                response = self.dp.respond(call, await self.dp.infer(call, request))
                binary_default = bool(request.parameters.get("binary_data_output", False))
                encoding = (response, request.outputs, binary_default, self.max_response_bytes)
                size = min_wire_bytes(response.outputs)
                if size >= threshold:
                    encoded = await self.offload.run(size, encode_response, *encoding)
                else:
                    encoded = encode_response(*encoding)
                payload, json_length = encoded
        except InferdError as exc:
            error = http_error(exc)
            return error.status, _JSON, error.body, extra + error.headers
        if json_length is None:
            return 200, _JSON, payload, extra
        extra.append((b"inference-header-content-length", str(json_length).encode()))
        return 200, _BINARY, payload, extra

    async def _decode(
        self, body: bytes, json_length: int | None, model: str, version: str
    ) -> InferRequest:
        args = (body, json_length, model, version, self.max_bytes_elements)
        json_size = len(body) if json_length is None else json_length
        if self.offload.is_large(json_size):  # orjson would hold the loop: a process
            return await self.offload.run_gil_bound(json_size, decode_request, *args)
        return await self.offload.run(len(body), decode_request, *args)  # binary: a thread

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str
    ) -> None:
        headers = self.pick_headers(scope["headers"])
        client = scope.get("client")
        handler = asyncio.current_task()
        watcher: list[asyncio.Task[None]] = []
        disconnected: list[bool] = []

        def read() -> Awaitable[bytes]:
            return read_body(receive, headers.get("length"), self.max_request_bytes)

        def watch() -> None:
            if handler is not None:
                # A client that goes away while its request waits has it removed unexecuted.
                watcher.append(asyncio.create_task(_on_disconnect(receive, handler, disconnected)))

        try:
            status, content_type, body, extra = await self.respond(
                model, version, headers, f"{client[0]}:{client[1]}" if client else "", read, watch
            )
        except asyncio.CancelledError:
            if not disconnected or handler is None:
                raise
            handler.uncancel()
            return None  # nobody is listening any more
        finally:
            if watcher:
                watcher[0].cancel()
        return await _send(send, status, content_type, body, extra)


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The whole request body from ASGI messages, refused (413) past `limit` bytes."""
    if declared is not None and declared.isdecimal() and int(declared) > limit:
        raise InferdError(
            ErrorKind.PAYLOAD_TOO_LARGE,
            f"request body of {declared} bytes exceeds the limit of {limit} bytes",
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError  # the client left before sending its body
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise InferdError(
                ErrorKind.PAYLOAD_TOO_LARGE, f"request body exceeds the limit of {limit} bytes"
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(
    send: Send, status: int, content_type: bytes, body: bytes, extra: list[tuple[bytes, bytes]]
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + extra})
    await send({"type": "http.response.body", "body": body})


async def _on_disconnect(receive: Receive, handler: asyncio.Task[Any], flag: list[bool]) -> None:
    """Wait for the client to hang up (the body is read: the next message is the
    disconnect), then cancel the handler, which removes the queued request."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            flag.append(True)
            handler.cancel()
            return
