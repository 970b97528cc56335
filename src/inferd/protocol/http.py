"""The HTTP adapter: KServe v2 REST routes over the DataPlane. It only translates."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from inferd import tracing
from inferd.access import AccessPolicy, ApiGroup
from inferd.dataplane import DataPlane
from inferd.errors import ErrorKind, InferdError, invalid
from inferd.events import CallContext
from inferd.limits import DEFAULT_LIMITS
from inferd.protocol.codec import decode_request, encode_response
from inferd.protocol.generate import GenerateEndpoint
from inferd.protocol.http_errors import http_error
from inferd.protocol.offload import Offload
from inferd.protocol.strict_values import TIMEOUT_MS, deadline_ns, header_length
from inferd.repository.config import to_json
from inferd.types import InferRequest, InferResponse, min_wire_bytes

log = logging.getLogger("inferd.http")

HEADER_LENGTH = "inference-header-content-length"
ROUTING_KEY = "inferd-routing-key"  # makes canary routing sticky
SYSTEM_SHM = "/v2/systemsharedmemory"
CUDA_SHM = "/v2/cudasharedmemory"
Endpoint = Callable[[Request], Awaitable[Response]]


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers
    )


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


def inferd_error_response(exc: InferdError) -> Response:
    error = http_error(exc)
    response = Response(error.body, status_code=error.status, media_type="application/json")
    response.raw_headers += error.headers
    return response


def errors_mapped(endpoint: Endpoint, access: AccessPolicy, group: ApiGroup) -> Endpoint:
    """Every route answers failures as `{"error": ...}` with the status from one table,
    after the call's credential is checked for its API group."""
    guarded = access.guards("http", group)

    @functools.wraps(endpoint)
    async def wrapper(request: Request) -> Response:
        try:
            if guarded:
                access.check("http", group, request.headers.get)
            return await endpoint(request)
        except InferdError as exc:
            return inferd_error_response(exc)
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            return error_response(500, "internal error; see the server log")

    return wrapper


class HttpAdapter:
    def __init__(self, dataplane: DataPlane, max_request_bytes: int) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes

    def routes(self) -> list[Route]:
        m = "/v2/models/{model}"
        mv = "/v2/models/{model}/versions/{version}"
        health, meta, stats = ApiGroup.HEALTH, ApiGroup.METADATA, ApiGroup.STATISTICS
        config, repo, infer = ApiGroup.MODEL_CONFIG, ApiGroup.MODEL_REPOSITORY, ApiGroup.INFERENCE
        shm = ApiGroup.SHARED_MEMORY
        # (path, endpoint, methods, Triton's API group: what --http-restricted-api names)
        table: list[tuple[str, Endpoint, list[str], ApiGroup]] = [
            ("/v2/models/stats", self.statistics, ["GET"], stats),  # before /v2/models/{model}
            ("/v2/health/live", self.live, ["GET"], health),
            ("/v2/health/ready", self.ready, ["GET"], health),
            ("/v2", self.server_metadata, ["GET"], meta),
            (m, self.model_metadata, ["GET"], meta),
            (mv, self.model_metadata, ["GET"], meta),
            (m + "/ready", self.model_ready, ["GET"], health),
            (mv + "/ready", self.model_ready, ["GET"], health),
            (m + "/config", self.model_config, ["GET"], config),
            (mv + "/config", self.model_config, ["GET"], config),
            (m + "/stats", self.statistics, ["GET"], stats),
            (mv + "/stats", self.statistics, ["GET"], stats),
            # POSTs never get here (InferEndpoint takes them first): these routes only make
            # other methods answer 405 rather than 404.
            (m + "/infer", self._infer_is_elsewhere, ["POST"], infer),
            (mv + "/infer", self._infer_is_elsewhere, ["POST"], infer),
            ("/v2/repository/index", self.repository_index, ["POST"], repo),
            ("/v2/repository/models/{model}/load", self.load_model, ["POST"], repo),
            ("/v2/repository/models/{model}/unload", self.unload_model, ["POST"], repo),
            (m + "/routing", self.routing, ["GET", "POST"], repo),
            (m + "/routing/promote", self.promote, ["POST"], repo),
            (m + "/routing/rollback", self.rollback, ["POST"], repo),
            (f"{SYSTEM_SHM}/status", self.shm_status, ["GET"], shm),
            (f"{SYSTEM_SHM}/region/{{region}}/status", self.shm_status, ["GET"], shm),
            (f"{SYSTEM_SHM}/region/{{region}}/register", self.shm_register, ["POST"], shm),
            (f"{SYSTEM_SHM}/unregister", self.shm_unregister, ["POST"], shm),
            (f"{SYSTEM_SHM}/region/{{region}}/unregister", self.shm_unregister, ["POST"], shm),
            (f"{CUDA_SHM}/status", self.cuda_shm_status, ["GET"], shm),
            (f"{CUDA_SHM}/region/{{region}}/status", self.cuda_shm_status, ["GET"], shm),
            (f"{CUDA_SHM}/region/{{region}}/register", self.cuda_shm_register, ["POST"], shm),
            (f"{CUDA_SHM}/unregister", self.cuda_shm_unregister, ["POST"], shm),
            (f"{CUDA_SHM}/region/{{region}}/unregister", self.cuda_shm_unregister, ["POST"], shm),
            ("/v2/trace/setting", self.trace_settings, ["GET", "POST"], ApiGroup.TRACE),
            (m + "/trace/setting", self.trace_settings, ["GET", "POST"], ApiGroup.TRACE),
            ("/v2/logging", self.log_settings, ["GET", "POST"], ApiGroup.LOGGING),
        ]
        access = self.dp.access
        routes = [
            Route(path, errors_mapped(fn, access, group), methods=methods)
            for path, fn, methods, group in table
        ]
        # Triton's generate extension: ASGI apps of their own, since they stream (they
        # check the inference group's credential themselves).
        for suffix, streaming in (("/generate", False), ("/generate_stream", True)):
            endpoint = GenerateEndpoint(
                self.dp, self.max_request_bytes, streaming, read_body, deadline_ns
            )
            routes += [Route(m + suffix, endpoint, methods=["POST"])]
            routes += [Route(mv + suffix, endpoint, methods=["POST"])]
        return routes

    async def _infer_is_elsewhere(self, request: Request) -> Response:
        raise AssertionError("POST .../infer is served by InferEndpoint")

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if self.dp.live() else 503)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.dp.ready() else 503)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.dp.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        p = request.path_params
        return json_response(self.dp.model_metadata(p["model"], p.get("version", "")))

    async def model_ready(self, request: Request) -> Response:
        p = request.path_params
        ready = self.dp.model_ready(p["model"], p.get("version", ""))
        return Response(status_code=200 if ready else 503)

    async def model_config(self, request: Request) -> Response:
        p = request.path_params
        return json_response(to_json(self.dp.model_config(p["model"], p.get("version", ""))))

    async def statistics(self, request: Request) -> Response:
        p = request.path_params
        doc = await self.dp.server_statistics(p.get("model", ""), p.get("version", ""))
        return json_response(doc)

    async def repository_index(self, request: Request) -> Response:
        doc = await self._json_body(request)
        return json_response(self.dp.repository_index(bool(doc.get("ready", False))))

    async def load_model(self, request: Request) -> Response:
        doc = await self._json_body(request)
        raw = doc.get("parameters", {})
        if not isinstance(raw, dict):
            raise invalid("'parameters' must be an object")
        parameters: dict[str, Any] = {}
        for key, value in raw.items():
            if key.startswith("file:"):
                # Triton's HTTP form: file contents travel base64-encoded.
                try:
                    parameters[key] = base64.b64decode(str(value), validate=True)
                except binascii.Error:
                    raise invalid(f"parameter '{key}' must be base64") from None
            else:
                parameters[key] = value
        await self.dp.load_model(request.path_params["model"], parameters)
        return Response(status_code=200)

    async def unload_model(self, request: Request) -> Response:
        await self._json_body(request)  # Triton's optional parameters: nothing to act on
        await self.dp.unload_model(request.path_params["model"])
        return Response(status_code=200)

    async def routing(self, request: Request) -> Response:
        name = request.path_params["model"]
        if request.method == "GET":
            return json_response(self.dp.routing(name))
        doc = await self._json_body(request)
        return json_response(self.dp.set_routing(name, doc.get("weights")))

    async def promote(self, request: Request) -> Response:
        doc = await self._json_body(request)
        return json_response(
            self.dp.promote(request.path_params["model"], str(doc.get("version", "")))
        )

    async def rollback(self, request: Request) -> Response:
        doc = await self._json_body(request)
        return json_response(
            self.dp.rollback(request.path_params["model"], str(doc.get("version", "")))
        )

    async def shm_status(self, request: Request) -> Response:
        return json_response(self.dp.shared_memory_status(request.path_params.get("region", "")))

    async def shm_register(self, request: Request) -> Response:
        doc = await self._json_body(request)
        self.dp.register_shared_memory(
            request.path_params["region"],
            doc.get("key"),
            doc.get("offset", 0),
            doc.get("byte_size"),
        )
        return Response(status_code=200)

    async def shm_unregister(self, request: Request) -> Response:
        await self._json_body(request)  # Triton's clients send an empty body
        self.dp.unregister_shared_memory(request.path_params.get("region", ""))
        return Response(status_code=200)

    async def cuda_shm_status(self, request: Request) -> Response:
        region = request.path_params.get("region", "")
        return json_response(self.dp.cuda_shared_memory_status(region))

    async def cuda_shm_register(self, request: Request) -> Response:
        await self._json_body(request)
        self.dp.register_cuda_shared_memory()
        return Response(status_code=200)

    async def cuda_shm_unregister(self, request: Request) -> Response:
        await self._json_body(request)  # nothing can be registered: nothing to do
        return Response(status_code=200)

    async def trace_settings(self, request: Request) -> Response:
        changes = await self._json_body(request) if request.method == "POST" else None
        model = request.path_params.get("model", "")
        return json_response(self.dp.runtime.trace_settings(model, changes))

    async def log_settings(self, request: Request) -> Response:
        changes = await self._json_body(request) if request.method == "POST" else None
        return json_response(self.dp.runtime.log_settings(changes))

    async def _json_body(self, request: Request) -> dict[str, Any]:
        body = await self._read_body(request)
        if not body.strip():
            return {}
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise invalid(f"malformed JSON request: {exc}") from None
        if not isinstance(doc, dict):
            raise invalid("malformed request: the JSON body must be an object")
        return doc

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        return await read_body(request.receive, declared, self.max_request_bytes)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")


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
    Two transports call it: `InferdHttpProtocol` (protocol/fast_http.py) straight from the
    HTTP parser, and `__call__` as a plain ASGI callable for the rare requests that
    protocol hands to ASGI (pipelined ones). Both skip Starlette's routing and its
    Request/Response objects (about a tenth of a small request's cost in a profile).
    """

    def __init__(
        self,
        dataplane: DataPlane,
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

    def pick_headers(self, pairs: list[tuple[bytes, bytes]]) -> dict[str, str]:
        return pick_headers(pairs, self.header_fields)

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
        traceparent = tracing.echo(ctx)  # "" unless the request carried a valid traceparent
        extra = [(b"traceparent", traceparent.encode())] if traceparent else []

        async def decode() -> InferRequest:
            ctx.deadline_ns = deadline_ns(headers.get("timeout_ms"), start_ns)
            json_length = header_length(headers.get("header_length"))
            body = await read()
            args = (body, json_length, model, version, self.max_bytes_elements)
            json_size = len(body) if json_length is None else json_length
            if self.offload.is_large(json_size):  # orjson would hold the loop: a process
                request = await self.offload.run_gil_bound(json_size, decode_request, *args)
            else:  # large binary data, if any, on a codec thread
                request = await self.offload.run(len(body), decode_request, *args)
            if on_decoded is not None:
                on_decoded()
            return request

        async def encode(
            request: InferRequest, response: InferResponse
        ) -> tuple[bytes, int | None]:
            binary_default = bool(request.parameters.get("binary_data_output", False))
            return await self.offload.run(
                min_wire_bytes(response.outputs),
                encode_response,
                response,
                request.outputs,
                binary_default,
                self.max_response_bytes,
            )

        try:
            if self.guarded:
                self.dp.access.check(
                    "http", ApiGroup.INFERENCE, lambda name: headers.get(_CREDENTIAL + name)
                )
            payload, json_length = await self.dp.infer(model, version, decode, ctx, encode)
        except InferdError as exc:
            error = http_error(exc)
            return error.status, _JSON, error.body, extra + error.headers
        if json_length is None:
            return 200, _JSON, payload, extra
        extra.append((b"inference-header-content-length", str(json_length).encode()))
        return 200, _BINARY, payload, extra

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


_ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


class InferdApp:
    """The ASGI app: the infer route first, everything else (and lifespan) on Starlette."""

    def __init__(self, routes: Starlette, infer: InferEndpoint) -> None:
        self.routes = routes
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = scope.get("raw_path") or b""
        # The server decodes %2F to "/" before routing: /v2/models/a%2Fversions%2F1/infer
        # would reach model a, version 1. No model or version name holds a "/".
        if b"%" in raw_path and _ENCODED_SLASH.search(raw_path):
            response = error_response(
                400,
                "the path holds an encoded '/' (%2F): model and version names cannot contain "
                f"'/' ({raw_path.decode('ascii', 'replace')[:200]})",
            )
            return await response(scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "POST":
            target = InferEndpoint.match(scope["path"])
            if target is not None:
                return await self.infer(scope, receive, send, *target)
        return await self.routes(scope, receive, send)


def build_app(
    dataplane: DataPlane,
    max_request_bytes: int,
    lifespan: Any = None,
    *,
    offload: Offload | None = None,
    max_response_bytes: int = 0,
    max_bytes_elements: int = DEFAULT_LIMITS.max_bytes_elements,
) -> InferdApp:
    adapter = HttpAdapter(dataplane, max_request_bytes)
    routes = Starlette(
        routes=adapter.routes(),
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    infer = InferEndpoint(
        dataplane, max_request_bytes, offload, max_response_bytes, max_bytes_elements
    )
    return InferdApp(routes, infer)
