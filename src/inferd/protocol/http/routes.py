"""The HTTP adapter's routes: every KServe v2 REST route but infer, over the DataPlane.

Each route only translates; its failures answer through `errors_mapped`
(protocol/http/error_responses.py)."""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferd.config.model_config import to_json
from inferd.dataplane.access import AccessPolicy, ApiGroup
from inferd.dataplane.plane import DataPlane
from inferd.errors import InferdError, invalid
from inferd.protocol.http.docs_page import ASSETS, CSP, PAGE, DocsPage
from inferd.protocol.http.error_responses import http_error
from inferd.protocol.http.generate import GenerateEndpoint
from inferd.protocol.http.infer_route import read_body
from inferd.protocol.http.openapi_document import OPENAPI_PATH, OpenApiDocument, ServedRoute
from inferd.protocol.strict_values import deadline_ns

log = logging.getLogger("inferd.http")

SYSTEM_SHM = "/v2/systemsharedmemory"
CUDA_SHM = "/v2/cudasharedmemory"
Endpoint = Callable[[Request], Awaitable[Response]]
_PAGE_HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff"}


def json_response(
    doc: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers
    )


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
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
    def __init__(self, dataplane: DataPlane, max_request_bytes: int, docs_ui: bool = True) -> None:
        """`docs_ui`: serve the Swagger UI page (`/docs`, `--docs-ui`)."""
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes
        self.docs = DocsPage() if docs_ui else None
        # The OpenAPI document of the routes below (their table is passed in routes()).
        self.openapi = OpenApiDocument(
            dataplane.registry,
            dataplane.access,
            [],
            admin_api=dataplane.admin.admin_api,
            shared_memory="system_shared_memory" in dataplane.metadata.extensions,
            assets=list(ASSETS) if docs_ui else [],
        )

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
            (m + "/feedback", self.feedback, ["POST"], infer),  # docs/capture.md
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
            (m + "/drift", self.drift, ["GET"], stats),  # docs/monitoring.md
            (mv + "/drift", self.drift, ["GET"], stats),
            (m + "/drift/reference", self.drift_reference, ["POST"], repo),
            (mv + "/drift/reference", self.drift_reference, ["POST"], repo),
            (OPENAPI_PATH, self.openapi_document, ["GET"], meta),  # docs/openapi.md
        ]
        if self.docs is not None:  # the page is the document's: the same access rule
            table += [
                ("/docs", self.docs_page, ["GET"], meta),
                ("/docs/{asset}", self.docs_asset, ["GET"], meta),
            ]
        access = self.dp.access
        routes = [
            Route(path, errors_mapped(fn, access, group), methods=methods)
            for path, fn, methods, group in table
        ]
        served: list[ServedRoute] = [(path, methods, group) for path, _, methods, group in table]
        # Triton's generate extension: ASGI apps of their own, since they stream (they
        # check the inference group's credential themselves).
        for suffix, streaming in (("/generate", False), ("/generate_stream", True)):
            endpoint = GenerateEndpoint(
                self.dp, self.max_request_bytes, streaming, read_body, deadline_ns
            )
            for path in (m + suffix, mv + suffix):
                routes += [Route(path, endpoint, methods=["POST"])]
                served += [(path, ["POST"], infer)]
        self.openapi.served = served
        return routes

    async def _infer_is_elsewhere(self, request: Request) -> Response:
        raise AssertionError("POST .../infer is served by InferEndpoint")

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if self.dp.health.live() else 503)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.dp.health.ready() else 503)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.dp.metadata.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        p = request.path_params
        return json_response(self.dp.metadata.model_metadata(p["model"], p.get("version", "")))

    async def model_ready(self, request: Request) -> Response:
        p = request.path_params
        ready = self.dp.health.model_ready(p["model"], p.get("version", ""))
        return Response(status_code=200 if ready else 503)

    async def model_config(self, request: Request) -> Response:
        p = request.path_params
        return json_response(
            to_json(self.dp.metadata.model_config(p["model"], p.get("version", "")))
        )

    async def statistics(self, request: Request) -> Response:
        p = request.path_params
        doc = await self.dp.statistics.server_statistics(p.get("model", ""), p.get("version", ""))
        return json_response(doc)

    async def feedback(self, request: Request) -> Response:
        doc = await self._json_body(request)
        return json_response(self.dp.admin.feedback(request.path_params["model"], doc))

    async def repository_index(self, request: Request) -> Response:
        doc = await self._json_body(request)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid(f"'ready' must be true or false, got {str(ready)[:40]!r}")
        return json_response(self.dp.metadata.repository_index(ready))

    async def load_model(self, request: Request) -> Response:
        doc = await self._json_body(request)
        raw = doc.get("parameters", {})
        if not isinstance(raw, dict):
            raise invalid("'parameters' must be an object")
        parameters: dict[str, Any] = {}
        for key, value in raw.items():
            if key.startswith("file:"):
                # Triton's HTTP form: file contents travel base64-encoded.
                if not isinstance(value, str):
                    raise invalid(f"parameter '{key[:200]}' must be a base64 string")
                try:
                    parameters[key] = base64.b64decode(value, validate=True)
                except ValueError:  # binascii.Error, and non-ASCII text
                    raise invalid(f"parameter '{key[:200]}' must be base64") from None
            else:
                parameters[key] = value
        await self.dp.admin.load_model(request.path_params["model"], parameters)
        return Response(status_code=200)

    async def unload_model(self, request: Request) -> Response:
        doc = await self._json_body(request)
        parameters = doc.get("parameters", {})
        if not isinstance(parameters, dict):
            raise invalid("'parameters' must be an object")
        await self.dp.admin.unload_model(request.path_params["model"], parameters)
        return Response(status_code=200)

    async def routing(self, request: Request) -> Response:
        name = request.path_params["model"]
        if request.method == "GET":
            return json_response(self.dp.admin.routing(name))
        doc = await self._json_body(request)
        return json_response(self.dp.admin.set_routing(name, doc.get("weights")))

    async def promote(self, request: Request) -> Response:
        doc = await self._json_body(request)
        return json_response(
            self.dp.admin.promote(request.path_params["model"], str(doc.get("version", "")))
        )

    async def rollback(self, request: Request) -> Response:
        doc = await self._json_body(request)
        return json_response(
            self.dp.admin.rollback(request.path_params["model"], str(doc.get("version", "")))
        )

    async def shm_status(self, request: Request) -> Response:
        return json_response(
            self.dp.admin.shared_memory_status(request.path_params.get("region", ""))
        )

    async def shm_register(self, request: Request) -> Response:
        doc = await self._json_body(request)
        self.dp.admin.register_shared_memory(
            request.path_params["region"],
            doc.get("key"),
            doc.get("offset", 0),
            doc.get("byte_size"),
        )
        return Response(status_code=200)

    async def shm_unregister(self, request: Request) -> Response:
        await self._json_body(request)  # Triton's clients send an empty body
        self.dp.admin.unregister_shared_memory(request.path_params.get("region", ""))
        return Response(status_code=200)

    async def cuda_shm_status(self, request: Request) -> Response:
        region = request.path_params.get("region", "")
        return json_response(self.dp.admin.cuda_shared_memory_status(region))

    async def cuda_shm_register(self, request: Request) -> Response:
        await self._json_body(request)
        self.dp.admin.register_cuda_shared_memory()
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

    async def drift(self, request: Request) -> Response:
        p = request.path_params
        return json_response(self.dp.admin.drift(p["model"], p.get("version", "")))

    async def drift_reference(self, request: Request) -> Response:
        """An .npz archive (any content type but JSON), or `{"tensors": ...}` as JSON."""
        p = request.path_params
        if request.headers.get("content-type", "").startswith("application/json"):
            body: bytes | dict[str, Any] = await self._json_body(request)
        else:
            body = await self._read_body(request)
        doc = await self.dp.admin.set_drift_reference(p["model"], p.get("version", ""), body)
        return json_response(doc)

    async def openapi_document(self, request: Request) -> Response:
        return Response(self.openapi.json(), media_type="application/json")

    async def docs_page(self, request: Request) -> Response:
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    async def docs_asset(self, request: Request) -> Response:
        assert self.docs is not None  # the route exists only with the page
        data, media = await self.docs.asset(request.path_params["asset"])
        return Response(data, media_type=media, headers=_PAGE_HEADERS)

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


async def http_exception_response(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route: 404; a route without this method: 405),
    as every error: `{"error": ...}`, with the headers they carry (405's `Allow`)."""
    assert isinstance(exc, HTTPException)
    return error_response(
        exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", exc.headers
    )
