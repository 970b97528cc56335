"""One front end of `--workers N --engine`: the HTTP and gRPC ports (shared with its
siblings through SO_REUSEPORT), no model.

What is per connection happens here: HTTP parsing, decoding the infer request into
tensors, encoding the answer. The infer route and gRPC ModelInfer run the same adapter
code as one process (protocol/http/infer_route.py, protocol/grpc/model_infer.py) over an
`EngineClient`, which takes each request through the hop to the engine; every other route
and method is passed to the engine's own adapters (http_proxy.py, grpc_proxy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from inferd.dataplane.access import AccessPolicy
from inferd.engine import sockets
from inferd.engine.engine_client import EngineClient
from inferd.engine.grpc_proxy import GrpcProxy, engine_channel
from inferd.engine.http_proxy import HttpProxy
from inferd.engine.slab import shm_directory
from inferd.protocol import tls
from inferd.protocol.grpc.access_interceptor import AccessInterceptor
from inferd.protocol.grpc.handlers import SERVICE
from inferd.protocol.grpc.model_infer import ModelInferMethod
from inferd.protocol.grpc.service import METHOD_GROUPS
from inferd.protocol.http.app import InferdApp
from inferd.protocol.http.fast_path import protocol_class
from inferd.protocol.http.infer_route import InferEndpoint
from inferd.protocol.offload import Offload
from inferd.server import build as server
from inferd.server.shutdown import ShutdownClock
from inferd.settings import Settings
from inferd.workers.reuse_port import reuse_port_socket

log = logging.getLogger("inferd.engine")


class FrontEnd:
    def __init__(
        self, settings: Settings, directory: Path, access: AccessPolicy, index: int = 0
    ) -> None:
        self.settings = settings
        self.directory = directory
        slabs = shm_directory() or directory
        self.dataplane = EngineClient(access, sockets.hop(directory), slabs, index=index)
        self.shutdown = ShutdownClock(settings.exit_timeout_s)
        self.offload = Offload(settings.limits.offload_bytes)
        infer = InferEndpoint(
            self.dataplane,
            settings.max_request_bytes,
            self.offload,
            settings.max_response_bytes,
            settings.limits.max_bytes_elements,
        )
        proxy = HttpProxy(sockets.http(directory), settings.max_request_bytes)
        routes = Starlette(routes=[Mount("/", app=proxy)], lifespan=self._lifespan)
        self.app = InferdApp(routes, infer)
        self.grpc_server: grpc.aio.Server | None = None
        self.grpc_port: int | None = None  # the port bound, once serving
        self.channel: grpc.aio.Channel | None = None

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Listening only once the engine answers: until then the kernel gives this front
        # end no connection (the port is bound, not listening; workers/worker_role.py).
        await self.dataplane.connect()
        await _until_accepting(sockets.http(self.directory))
        if self.settings.grpc_port is not None:
            await self._start_grpc()
        log.info("front end serving (engine connected)")
        try:
            yield
        finally:
            # HTTP has drained (uvicorn waits for its requests before this); then gRPC,
            # then the link: a request accepted here gets its answer from the engine.
            self.dataplane.is_shutting_down = True
            if self.grpc_server is not None:
                await self.grpc_server.stop(grace=self.shutdown.remaining_s())
            if self.channel is not None:
                await self.channel.close()
            self.dataplane.close()
            self.offload.close()
            self.shutdown.finished(True)

    async def _start_grpc(self) -> None:
        s = self.settings
        access = self.dataplane.access
        guarded = any(access.guards("grpc", g) for g in set(METHOD_GROUPS.values()))
        server = grpc.aio.server(
            interceptors=[AccessInterceptor(access, METHOD_GROUPS)] if guarded else None,
            options=[
                ("grpc.max_receive_message_length", s.max_request_bytes),
                ("grpc.max_send_message_length", s.max_response_bytes),
                ("grpc.so_reuseport", 1),
            ],
        )
        infer = ModelInferMethod(self.dataplane, s.limits, self.offload, s.max_response_bytes)
        handler = grpc.unary_unary_rpc_method_handler(infer.ModelInfer)
        self.channel = engine_channel(
            sockets.grpc(self.directory), max(s.max_request_bytes, s.max_response_bytes)
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),
                GrpcProxy(self.channel),
            )
        )
        address = f"{s.host}:{s.grpc_port}"
        if s.grpc_tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, tls.grpc_credentials(s.grpc_tls))
        if not bound:
            raise OSError(f"cannot listen for gRPC on {address}")
        await server.start()
        self.grpc_server, self.grpc_port = server, bound

    def uvicorn_config(self) -> uvicorn.Config:
        s = self.settings
        return uvicorn.Config(
            self.app,
            host=s.host,
            port=s.http_port,
            http=protocol_class(self.app.infer, s.limits),
            log_level=s.log_level.lower(),
            access_log=False,
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=int(s.exit_timeout_s),
            **tls.uvicorn_options(s.http_tls),
        )


async def _until_accepting(path: Path) -> None:
    """The engine's HTTP socket takes connections (it listens a moment after the hop)."""
    while True:
        try:
            _, writer = await asyncio.open_unix_connection(str(path))
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


def run_front_end(settings: Settings, directory: Path, index: int) -> None:
    sock = reuse_port_socket(settings)
    front = FrontEnd(settings, directory, server.access_policy(settings), index)
    server.UvicornServer(front.uvicorn_config(), front).run(sockets=[sock])
    front.shutdown.exit_if_incomplete()
