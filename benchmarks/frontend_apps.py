"""The apps `frontend_servers.py` hands granian (run by granian's worker process, not alone).

- `rsgi`: granian's RSGI interface answering the KServe v2 infer route,
  `POST /v2/models/{m}[/versions/{v}]/infer`, over the same core as inferd's own front end:
  `InferEndpoint.respond` (credentials, `DataPlane.start` → admit → decode with the codec,
  JSON and the binary tensor extension → infer → respond → encode), the server built and its
  models loaded by `InferenceServer`'s own lifespan. Every other path is a 404: this is the
  infer route's cost, not a port of the front end.
- `asgi`: the existing Starlette app (every route, the infer route through its ASGI
  callable) under granian's ASGI interface, lifespan included.

Both read the repository from FRONTEND_BENCH_REPO and serve gRPC on FRONTEND_BENCH_GRPC_PORT,
as the uvicorn server they are compared with does.
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from inferd.errors import ErrorKind, InferdError
from inferd.protocol.http.infer_route import InferEndpoint
from inferd.server.build import InferenceServer
from inferd.settings import Settings

_NOT_FOUND = b'{"error":"not found"}'


def _server() -> InferenceServer:
    settings = Settings(
        model_repository=Path(os.environ["FRONTEND_BENCH_REPO"]),
        http_port=int(os.environ.get("FRONTEND_BENCH_HTTP_PORT", "0")),
        grpc_port=int(os.environ["FRONTEND_BENCH_GRPC_PORT"]),
        metrics_port=None,
        log_level="WARNING",
    )
    return InferenceServer(settings)


class RsgiInfer:
    """The infer route over RSGI: headers picked from granian's mapping, the body read
    whole when the route asks for it, one `response_bytes` per answer."""

    def __init__(self) -> None:
        self.server: InferenceServer | None = None
        self.endpoint: InferEndpoint | None = None
        self._life: AbstractAsyncContextManager[None] | None = None
        self._fields: list[tuple[str, str]] = []

    def __rsgi_init__(self, loop: Any) -> None:
        # Before granian serves: load the repository as inferd's lifespan does.
        server = self.server = _server()
        self._life = server._lifespan(server.app)  # type: ignore[arg-type]
        loop.run_until_complete(self._life.__aenter__())
        self.endpoint = server.app.infer
        self._fields = [(name.decode(), f) for name, f in self.endpoint.header_fields.items()]

    def __rsgi_del__(self, loop: Any) -> None:
        if self._life is not None:
            loop.run_until_complete(self._life.__aexit__(None, None, None))

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        target = InferEndpoint.match(scope.path) if scope.method == "POST" else None
        if target is None:
            proto.response_bytes(404, [("content-type", "application/json")], _NOT_FOUND)
            return
        found = scope.headers
        headers = {}
        for name, field in self._fields:
            value = found.get(name)
            if value is not None:
                headers[field] = value

        async def read() -> bytes:
            body: bytes = await proto()
            if len(body) > endpoint.max_request_bytes:  # as fast_path.py refuses it (413)
                raise InferdError(ErrorKind.PAYLOAD_TOO_LARGE, "request body exceeds the limit")
            return body

        status, content_type, body, extra = await endpoint.respond(
            target[0], target[1], headers, scope.client, read
        )
        out = [("content-type", content_type.decode())]
        out += [(k.decode(), v.decode()) for k, v in extra]
        proto.response_bytes(status, out, body)


rsgi = RsgiInfer()


def asgi() -> Any:
    """The existing ASGI app (granian's `factory=True`: built in its worker)."""
    return _server().app
