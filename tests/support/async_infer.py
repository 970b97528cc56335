"""One request to a model with one FP32 input `IN` [1, 1], over HTTP (JSON, httpx) or gRPC
(tritonclient's asyncio client), answered as one `Reply` either way: the feature tests that
compare what both protocols do (admission, priorities, deadlines) send through it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

import httpx
import numpy as np
import tritonclient.grpc.aio as grpc_aio
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException


class Addresses(Protocol):
    """Where a server answers: a RunningServer, or a command
    (tests/integration/engine/test_engine.py)."""

    @property
    def url(self) -> str: ...

    @property
    def grpc_address(self) -> str: ...


PROTOCOLS = ["http", "grpc"]

# Outcomes on either wire: the HTTP status, the gRPC code's name.
OK = {"http": "200", "grpc": "OK"}
SHED = {"http": "429", "grpc": "RESOURCE_EXHAUSTED"}
DEADLINE = {"http": "504", "grpc": "DEADLINE_EXCEEDED"}
BAD_REQUEST = {"http": "400", "grpc": "INVALID_ARGUMENT"}
FAILED = {"http": "500", "grpc": "INTERNAL"}  # the model raised
UNAVAILABLE = {"http": "503", "grpc": "UNAVAILABLE"}


@dataclass
class Reply:
    status: str  # "200", "429"... over HTTP; "OK", "RESOURCE_EXHAUSTED"... over gRPC
    message: str = ""  # the error's text
    headers: dict[str, str] = field(default_factory=dict)  # HTTP only
    data: list[float] = field(default_factory=list)
    version: str = ""  # the version that answered


class AsyncInfer:
    def __init__(
        self,
        protocol: str,
        server: Addresses,
        timeout_s: float = 30,
        connections: int | None = None,
    ) -> None:
        self.protocol = protocol
        self.http: httpx.AsyncClient | None = None
        self.grpc: Any = None
        if protocol == "http":
            pool: dict[str, Any] = {}  # httpx's default pool unless `connections` is given
            if connections:
                pool["limits"] = httpx.Limits(max_connections=connections)
            self.http = httpx.AsyncClient(base_url=server.url, timeout=timeout_s, **pool)
        else:
            self.grpc = grpc_aio.InferenceServerClient(server.grpc_address)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.grpc is not None:
            await self.grpc.close()

    async def __call__(
        self, model: str, value: float, priority: int = 0, timeout_us: int = 0, deadline_ms: int = 0
    ) -> Reply:
        """`priority` and `timeout_us` (0: not sent) are the request's parameters of those
        names (tritonclient's `priority` and `timeout` arguments over gRPC); `deadline_ms`
        (0: none) is the client's deadline: the inferd-timeout-ms header, the gRPC deadline."""
        if self.http is not None:
            doc: dict[str, object] = {
                "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [value]}]
            }
            parameters = {"priority": priority} if priority else {}
            if timeout_us:
                parameters["timeout"] = timeout_us
            if parameters:
                doc["parameters"] = parameters
            headers = {"inferd-timeout-ms": str(deadline_ms)} if deadline_ms else {}
            r = await self.http.post(f"/v2/models/{model}/infer", json=doc, headers=headers)
            if r.status_code != 200:
                return Reply(str(r.status_code), r.json()["error"], dict(r.headers))
            answer = r.json()
            return Reply(
                "200",
                headers=dict(r.headers),
                data=answer["outputs"][0]["data"],
                version=answer["model_version"],
            )
        inp = InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
        try:
            result = await self.grpc.infer(
                model,
                [inp],
                priority=priority,
                timeout=timeout_us or None,
                client_timeout=deadline_ms / 1000 if deadline_ms else None,
            )
        except InferenceServerException as exc:
            return Reply(str(exc.status()).removeprefix("StatusCode."), str(exc.message()))
        version = result.get_response().model_version
        return Reply("OK", data=result.as_numpy("OUT").ravel().tolist(), version=version)
