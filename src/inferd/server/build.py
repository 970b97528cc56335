"""Build the server from settings, run it, and shut it down in order."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from types import FrameType
from typing import Protocol

import grpc
import uvicorn
from starlette.applications import Starlette

from inferd.backends.python import model_prints
from inferd.backends.python.custom_metrics import CustomMetrics
from inferd.dataplane.access import TOKEN_ENV, AccessError, AccessPolicy, ApiGroup
from inferd.dataplane.cache_step import build_cache
from inferd.dataplane.capture import Capture
from inferd.dataplane.plane import DataPlane, PlaneOptions
from inferd.events import Telemetry
from inferd.limits import ensure_file_descriptors
from inferd.metrics.cache_families import CacheCollector
from inferd.metrics.capture_families import CaptureCollector
from inferd.metrics.degrade_families import DegradationCollector
from inferd.metrics.metrics_endpoint import MetricsServer
from inferd.metrics.prometheus import MetricsSink
from inferd.metrics.trace_families import TraceFileCollector
from inferd.protocol import error_text, tls
from inferd.protocol.grpc import service as grpc_adapter
from inferd.protocol.http.app import InferdApp, build_app
from inferd.protocol.http.fast_path import protocol_class
from inferd.protocol.offload import Offload
from inferd.repository import memory_release as memory
from inferd.repository.canary_guard import CanaryGuard
from inferd.repository.degrade_guard import DegradationGuard
from inferd.repository.registry import ModelRegistry
from inferd.repository.uploads import UPLOAD_MODES
from inferd.repository.watcher import RepositoryPoller
from inferd.server.python_host import ServerHost
from inferd.server.role import ServerRole
from inferd.server.shutdown import ShutdownClock
from inferd.settings import Settings
from inferd.telemetry.request_log import RequestLogSink
from inferd.telemetry.trace_config import OPENTELEMETRY
from inferd.telemetry.trace_file import TraceFileSink
from inferd.telemetry.trace_settings import TraceSettings
from inferd.telemetry.tracing import TraceSink

log = logging.getLogger("inferd.server")


class InferenceServer:
    def __init__(
        self,
        settings: Settings,
        role: ServerRole | None = None,
    ) -> None:
        """`role`: what this process is besides a server (role.py): one of `--workers N`,
        or the engine of `--workers N --engine`; None: a server of its own."""
        self.settings = settings
        self.role = role = role or ServerRole()
        error_text.set_verbose(settings.verbose_errors)
        self.telemetry = Telemetry()
        self.telemetry.add(RequestLogSink(settings.log_sample_rate))
        # Tracing (--trace-config): spans to a collector, or Triton's trace file.
        self.trace_sink: TraceSink | None = None
        self.trace_file: TraceFileSink | None = None
        trace_settings = TraceSettings(settings.trace)
        if settings.trace.mode == OPENTELEMETRY:
            self.trace_sink = TraceSink(settings.trace.url, settings=trace_settings)
            self.telemetry.add(self.trace_sink)
        elif settings.trace.file:
            self.trace_file = TraceFileSink(settings.trace.file, trace_settings)
            self.telemetry.add(self.trace_file)
        self.registry = ModelRegistry(
            settings.model_repository, self.telemetry, settings.execution_timeout_ms
        )
        self.shutdown = ShutdownClock(settings.exit_timeout_s)
        admin = admin_api_enabled(settings)
        access = access_policy(settings)
        # The response cache: one per process (each worker of --workers N its own local tier,
        # Redis shared; with --engine, the engine's), for models whose config enables it.
        self.response_cache = build_cache(settings.cache, self.registry)
        single = role.processes == 1
        self.capture = Capture(self.registry, settings.capture, single_process=single)
        self.dataplane = DataPlane(
            self.registry,
            self.telemetry,
            PlaneOptions(
                admin_api=admin,
                model_upload=settings.model_upload,
                max_inflight=settings.max_inflight_requests,
                max_response_bytes=settings.max_response_bytes,
                max_copy_bytes=settings.max_request_bytes,
                max_bytes_elements=settings.limits.max_bytes_elements,
                processes=role.processes,
            ),
            access=access,
            capture=self.capture,
            response_cache=self.response_cache,
            checked_signatures=role.signature_checks(self.registry),
            trace=trace_settings,
            statistics=role.statistics(),
        )
        # pb_utils' model loading API and custom metrics, for Python models.
        self.custom_metrics = CustomMetrics()
        self.model_host = ServerHost(self.dataplane, self.custom_metrics)
        self.registry.model_host = self.model_host
        open_to_all = unguarded_repository_api(settings, access)
        if admin and open_to_all:
            log.warning(
                "the repository API is on without a credential on %s: any client that "
                "reaches the port can load, unload and reroute models (docs/security.md: "
                "--admin-token-file, --http-restricted-api, --grpc-restricted-protocol)",
                " and ".join(open_to_all),
            )
        canary_guard = CanaryGuard(self.registry)
        self.telemetry.add(canary_guard)
        self.telemetry.keeps(canary_guard)
        self.telemetry.keeps(self.capture)
        if self.response_cache is not None:
            self.telemetry.keeps(self.response_cache)
        self.telemetry.watch(DegradationGuard(self.registry))  # models with tiers only
        self.poller: RepositoryPoller | None = None
        self.metrics: MetricsSink | None = None
        self.metrics_server: MetricsServer | None = None
        if settings.metrics_port is not None:
            self.metrics = MetricsSink(
                self.registry,
                self.dataplane.statistics.sink,
                settings.metrics_triton_names,
                host_metrics=role.exports_host,
            )
            self.telemetry.add(self.metrics)
            self.telemetry.keeps(self.metrics)
            self.metrics.prometheus.register(self.custom_metrics)
            self.metrics.prometheus.register(CaptureCollector(self.capture))
            if self.response_cache is not None:
                self.metrics.prometheus.register(CacheCollector(self.response_cache))
            self.metrics.prometheus.register(DegradationCollector(self.registry))
            if self.trace_file is not None:
                self.metrics.prometheus.register(TraceFileCollector(self.trace_file))
        # Large requests are decoded (and large responses encoded) off the event loop.
        self.offload = Offload(settings.limits.offload_bytes)
        self.app: InferdApp = build_app(
            self.dataplane,
            settings.max_request_bytes,
            lifespan=self._lifespan,
            offload=self.offload,
            max_response_bytes=settings.max_response_bytes,
            max_bytes_elements=settings.limits.max_bytes_elements,
            docs_ui=settings.docs_ui,
        )
        self.grpc_server: grpc.aio.Server | None = None
        self.grpc_servicer: grpc_adapter.InferenceServicer | None = None
        self.grpc_port: int | None = None  # the port bound, once serving

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        model_prints.install()
        self.model_host.bind_loop(asyncio.get_running_loop())
        self.capture.start()
        if self.trace_file is not None:
            self.trace_file.start()
        if self.response_cache is not None:
            await self.response_cache.start()  # never fails on a Redis that is down
        await self.load_models()
        # Field lesson 10: objects made while loading live forever; keep them out of GC scans.
        gc.collect()
        gc.freeze()
        # And give back what loading used only for a while (file reads, config completion):
        # the memory baseline a swap is measured against (docs/lifecycle.md).
        await asyncio.to_thread(memory.malloc_trim)
        if self.settings.model_control_mode == "poll":
            self.poller = RepositoryPoller(self.registry, self.settings.repository_poll_s)
            self.poller.start()
        if self.settings.grpc_port is not None:
            await self._start_grpc(self.settings.grpc_port)
        # The role's own (an engine's hop to its front ends, a worker's peer socket): last,
        # front ends connect once models are loaded.
        await self.role.start(self.dataplane, self.metrics)
        port = self.settings.metrics_port
        if self.role.serves_metrics and self.metrics is not None and port is not None:
            prometheus = self.metrics.prometheus
            limits = self.settings.limits
            self.metrics_server = MetricsServer(prometheus, self.settings.host, port, limits)
            log.info(
                "metrics at http://%s:%d/metrics", self.settings.host, self.metrics_server.port
            )
        log.info("%s", self.role.listening(self.settings, self.dataplane.health.ready()))
        try:
            yield
        finally:
            # Shutdown: 1. report not ready; 2. stop accepting gRPC calls, letting running
            # ones finish (uvicorn does the same for HTTP); 3. let queued and running requests
            # finish and release every model (batchers drain before closing instances). All
            # within one --exit-timeout-secs from the signal (shutdown.py).
            self.dataplane.is_shutting_down = True
            if self.poller is not None:
                await self.poller.stop()
            log.info("shutting down: draining requests and unloading models")
            await self.role.close_first()  # an engine's hop: its front ends drained first
            if self.grpc_server is not None:
                await self.grpc_server.stop(grace=self.shutdown.remaining_s())
            drained = True
            try:
                async with asyncio.timeout(self.shutdown.remaining_s()):
                    await self.registry.unload_all()
            except TimeoutError:
                drained = False
                log.warning("models did not drain within %.1fs", self.settings.exit_timeout_s)
            self.dataplane.shared_memory.unregister()  # unmap the clients' regions
            await asyncio.to_thread(self.capture.close)  # the last captures, to disk
            if self.response_cache is not None:
                await self.response_cache.close()
            # 4. flush traces, then stop the metrics endpoint last, so the drain stays visible.
            if self.trace_sink is not None:
                await asyncio.to_thread(self.trace_sink.shutdown)
            if self.trace_file is not None:
                await asyncio.to_thread(self.trace_file.close)
            if self.metrics_server is not None:
                self.metrics_server.close()
            await self.role.close_last()  # a worker's peer socket
            if self.metrics is not None:
                self.metrics.close()
            self.offload.close()
            self.shutdown.finished(drained)

    async def load_models(self) -> None:
        """The models the settings say to serve at start (explicit mode: --load-model's);
        one that fails is logged and listed, and the others load."""
        log.info("loading model repository %s", self.settings.model_repository)
        if self.settings.model_control_mode == "explicit":
            names = list(self.settings.load_models)
            await self.registry.load_all(None if "*" in names else names)
        else:
            await self.registry.load_all()
        for row in self.registry.index():
            if row["state"] != "READY":
                log.warning(
                    "model %s%s is %s: %s",
                    row["name"],
                    f" version {row['version']}" if "version" in row else "",
                    row["state"],
                    row.get("reason", ""),
                )

    async def _start_grpc(self, port: int) -> None:
        address = self.role.grpc_address(self.settings, port)
        self.grpc_server, self.grpc_port, self.grpc_servicer = grpc_adapter.build_server(
            self.dataplane,
            address.host,
            address.port,
            self.settings.max_request_bytes,
            self.settings.max_response_bytes,
            reuse_port=address.reuse_port,
            tls=address.tls,
            limits=self.settings.limits,
            offload=self.offload,
        )
        if not self.grpc_port:
            raise OSError(f"cannot listen for gRPC on {address.host}:{address.port}")
        await self.grpc_server.start()
        if not address.host.startswith("unix:"):
            log.info("gRPC server listening on %s:%d", self.settings.host, self.grpc_port)

    def uvicorn_config(self) -> uvicorn.Config:
        where = self.role.http_where(self.settings)
        return uvicorn.Config(
            self.app,
            **where,
            http=protocol_class(self.app.infer, self.settings.limits),
            log_level=self.settings.log_level.lower(),
            access_log=False,
            log_config=None,  # inferd's own handlers (text or JSON) format uvicorn's lines too
            lifespan="on",
            timeout_graceful_shutdown=int(self.settings.exit_timeout_s),
        )


def admin_api_enabled(settings: Settings) -> bool:
    if settings.admin_api is None:
        return settings.model_control_mode == "explicit"
    return settings.admin_api


def unguarded_repository_api(settings: Settings, access: AccessPolicy) -> list[str]:
    """The protocols whose repository API any client may call (no credential set)."""
    protocols = ["http"] + ([] if settings.grpc_port is None else ["grpc"])
    return [p for p in protocols if not access.guards(p, ApiGroup.MODEL_REPOSITORY)]


def access_policy(settings: Settings) -> AccessPolicy:
    """The credentials each API needs, after checking that the security settings hold
    together (AccessError / TlsError, naming the option, when they don't)."""
    access = AccessPolicy(
        settings.http_restricted_api, settings.grpc_restricted_protocol, settings.admin_token
    )
    admin = admin_api_enabled(settings)
    if settings.model_upload not in UPLOAD_MODES:
        raise AccessError(
            f"--allow-model-upload '{settings.model_upload}': expected one of "
            f"{', '.join(UPLOAD_MODES)}"
        )
    if settings.model_upload != "off" and not admin:
        raise AccessError(
            "--allow-model-upload needs the repository API: --model-control-mode explicit "
            "or --admin-api on"
        )
    open_to_all = unguarded_repository_api(settings, access)
    if settings.model_upload == "code" and open_to_all:
        # Uploaded code runs as the server's user: never for whoever reaches the port.
        raise AccessError(
            "--allow-model-upload=code needs a credential on the repository API, and "
            f"{' and '.join(open_to_all)} has none: set --admin-token-file (or "
            f"{TOKEN_ENV}), or --http-restricted-api / --grpc-restricted-protocol "
            "model-repository:KEY=VALUE"
        )
    if settings.http_tls is not None:
        tls.check(settings.http_tls, "--tls-cert/--tls-key/--tls-client-ca")
    if settings.grpc_tls is not None and settings.grpc_port is not None:
        tls.check(settings.grpc_tls, "gRPC TLS (--grpc-server-cert/--grpc-server-key/...)")
    return access


class _Draining(Protocol):
    is_shutting_down: bool


class Served(Protocol):
    """What UvicornServer stops: a server (or a front end) with a shutdown clock."""

    @property
    def dataplane(self) -> _Draining: ...

    @property
    def shutdown(self) -> ShutdownClock: ...


class UvicornServer(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM/SIGINT once it has shut down, so the process dies
    by the signal. After a graceful drain inferd exits with status 0 instead, as process
    supervisors (Kubernetes, systemd) expect from a clean stop. And readiness turns false
    the moment the signal arrives, before the drain, so load balancers stop sending; the
    signal also starts the shutdown's deadline and its watchdog (shutdown.py)."""

    def __init__(self, config: uvicorn.Config, server: Served) -> None:
        super().__init__(config)
        self._server = server

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._server.dataplane.is_shutting_down:
            log.info("signal %d: not ready any more, draining requests", sig)
        self._server.dataplane.is_shutting_down = True
        self._server.shutdown.begin(watchdog=True)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def run(
    settings: Settings, role: ServerRole | None = None, sock: socket.socket | None = None
) -> None:
    """One server process: of its own (`--workers 1`; cli.main runs the supervisor for
    more), or in a `role` (workers/worker_role.py, engine/engine_role.py); `sock`: a bound
    socket to serve HTTP on (the port the processes of `--workers N` share)."""
    ensure_file_descriptors(settings.limits)
    memory.configure_allocator()
    server = InferenceServer(settings, role)
    UvicornServer(server.uvicorn_config(), server).run(sockets=None if sock is None else [sock])
    server.shutdown.exit_if_incomplete()
