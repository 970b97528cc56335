"""The HTTP adapter: KServe v2 REST routes over the DataPlane. It only translates."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferd import tracing
from inferd.dataplane import DataPlane
from inferd.errors import ErrorKind, InferdError, invalid
from inferd.events import CallContext
from inferd.protocol.codec import decode_request, encode_response
from inferd.repository.config import to_json
from inferd.types import InferRequest

log = logging.getLogger("inferd.http")

STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.PERMISSION_DENIED: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.PAYLOAD_TOO_LARGE: 413,
    ErrorKind.RESOURCE_EXHAUSTED: 429,
    ErrorKind.MODEL_ERROR: 500,
    ErrorKind.INTERNAL: 500,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.DEADLINE_EXCEEDED: 504,
}

HEADER_LENGTH = "inference-header-content-length"
ROUTING_KEY = "inferd-routing-key"  # makes canary routing sticky
TIMEOUT_MS = "inferd-timeout-ms"  # the client's deadline for this request
RETRY_AFTER_S = "1"
Endpoint = Callable[[Request], Awaitable[Response]]


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers
    )


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


def inferd_error_response(exc: InferdError, headers: dict[str, str] | None = None) -> Response:
    if exc.kind is ErrorKind.RESOURCE_EXHAUSTED:
        # Shed load: "retry later", which load balancers and clients act on.
        headers = {**(headers or {}), "Retry-After": RETRY_AFTER_S}
    return error_response(STATUS[exc.kind], exc.message, headers)


def errors_mapped(endpoint: Endpoint) -> Endpoint:
    """Every route answers failures as `{"error": ...}` with the status from one table."""

    @functools.wraps(endpoint)
    async def wrapper(request: Request) -> Response:
        try:
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
        table: list[tuple[str, Endpoint, list[str]]] = [
            ("/v2/models/stats", self.statistics, ["GET"]),  # before /v2/models/{model}
            ("/v2/health/live", self.live, ["GET"]),
            ("/v2/health/ready", self.ready, ["GET"]),
            ("/v2", self.server_metadata, ["GET"]),
            (m, self.model_metadata, ["GET"]),
            (mv, self.model_metadata, ["GET"]),
            (m + "/ready", self.model_ready, ["GET"]),
            (mv + "/ready", self.model_ready, ["GET"]),
            (m + "/config", self.model_config, ["GET"]),
            (mv + "/config", self.model_config, ["GET"]),
            (m + "/stats", self.statistics, ["GET"]),
            (mv + "/stats", self.statistics, ["GET"]),
            (m + "/infer", self.infer, ["POST"]),
            (mv + "/infer", self.infer, ["POST"]),
            ("/v2/repository/index", self.repository_index, ["POST"]),
            ("/v2/repository/models/{model}/load", self.load_model, ["POST"]),
            ("/v2/repository/models/{model}/unload", self.unload_model, ["POST"]),
            (m + "/routing", self.routing, ["GET", "POST"]),
            (m + "/routing/promote", self.promote, ["POST"]),
            (m + "/routing/rollback", self.rollback, ["POST"]),
        ]
        return [Route(path, errors_mapped(fn), methods=methods) for path, fn, methods in table]

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
        return json_response(self.dp.model_statistics(p.get("model", ""), p.get("version", "")))

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

    async def infer(self, request: Request) -> Response:
        start_ns = time.perf_counter_ns()
        ctx = CallContext(
            "http",
            _peer(request),
            request.headers.get("traceparent", ""),
            time.time(),
            start_ns,
            request.headers.get(ROUTING_KEY, ""),
        )
        traceparent = tracing.echo(ctx)  # "" unless the request carried a valid traceparent
        trace_headers = {"traceparent": traceparent} if traceparent else None
        model, version = request.path_params["model"], request.path_params.get("version", "")
        decoded: list[InferRequest] = []
        handler = asyncio.current_task()
        watcher: list[asyncio.Task[None]] = []
        disconnected: list[bool] = []

        async def decode() -> InferRequest:
            ctx.deadline_ns = _deadline_ns(request, start_ns)
            header_length = _header_length(request)
            body = await self._read_body(request)
            decoded.append(decode_request(body, header_length, model, version))
            if handler is not None:
                # A client that goes away while its request waits has it removed unexecuted.
                watcher.append(asyncio.create_task(_on_disconnect(request, handler, disconnected)))
            return decoded[0]

        try:
            response = await self.dp.infer(model, version, decode, ctx)
        except InferdError as exc:
            return inferd_error_response(exc, trace_headers)
        except asyncio.CancelledError:
            if not disconnected or handler is None:
                raise
            handler.uncancel()
            return Response(status_code=499)  # nobody is listening any more
        finally:
            if watcher:
                watcher[0].cancel()
        infer_request = decoded[0]
        binary_default = bool(infer_request.parameters.get("binary_data_output", False))
        payload, json_length = encode_response(response, infer_request.outputs, binary_default)
        if json_length is None:
            return Response(payload, media_type="application/json", headers=trace_headers)
        headers = {"Inference-Header-Content-Length": str(json_length)}
        if trace_headers is not None:
            headers.update(trace_headers)
        return Response(payload, media_type="application/octet-stream", headers=headers)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise InferdError(
                ErrorKind.PAYLOAD_TOO_LARGE,
                f"request body of {declared} bytes exceeds the limit of {limit} bytes",
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise InferdError(
                    ErrorKind.PAYLOAD_TOO_LARGE,
                    f"request body exceeds the limit of {limit} bytes",
                )
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _on_disconnect(request: Request, handler: asyncio.Task[Any], flag: list[bool]) -> None:
    """Wait for the client to hang up (the body is read: the next message is the
    disconnect), then cancel the handler, which removes the queued request."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            flag.append(True)
            handler.cancel()
            return


def _deadline_ns(request: Request, start_ns: int) -> int | None:
    raw = request.headers.get(TIMEOUT_MS)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise invalid(f"{TIMEOUT_MS} '{raw}' is not a number of milliseconds") from None
    if not ms > 0:
        raise invalid(f"{TIMEOUT_MS} must be > 0, got {raw}")
    return start_ns + int(ms * 1e6)


def _peer(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else ""


def _header_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise invalid(f"Inference-Header-Content-Length '{raw}' is not an integer") from None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")


def build_app(dataplane: DataPlane, max_request_bytes: int, lifespan: Any = None) -> Starlette:
    adapter = HttpAdapter(dataplane, max_request_bytes)
    return Starlette(
        routes=adapter.routes(),
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
