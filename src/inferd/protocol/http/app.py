"""The HTTP adapter: KServe v2 REST over the DataPlane, as one ASGI app. It only translates.

The infer route (infer_route.py) is matched first, off Starlette's routing; every other route
(routes.py) and the lifespan run on Starlette. Failures: error_responses.py."""

from __future__ import annotations

import re
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from inferd.dataplane.plane import DataPlane
from inferd.limits import DEFAULT_LIMITS
from inferd.protocol.http.infer_route import InferEndpoint
from inferd.protocol.http.openapi_document import OpenApiDocument
from inferd.protocol.http.routes import HttpAdapter, error_response, http_exception_response
from inferd.protocol.offload import Offload

_ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


class InferdApp:
    """The ASGI app: the infer route first, everything else (and lifespan) on Starlette."""

    def __init__(
        self, routes: Starlette, infer: InferEndpoint, openapi: OpenApiDocument | None = None
    ) -> None:
        self.routes = routes
        self.infer = infer
        self.openapi = openapi  # the document of these routes (None: a front end's proxy)

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
    docs_ui: bool = True,
) -> InferdApp:
    adapter = HttpAdapter(dataplane, max_request_bytes, docs_ui)
    routes = Starlette(
        routes=adapter.routes(),
        exception_handlers={HTTPException: http_exception_response},
        lifespan=lifespan,
    )
    infer = InferEndpoint(
        dataplane, max_request_bytes, offload, max_response_bytes, max_bytes_elements
    )
    return InferdApp(routes, infer, adapter.openapi)
