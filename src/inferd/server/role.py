"""What a server process is besides a server of its own: one of `--workers N`
(workers/worker_role.py) or the engine of `--workers N --engine` (engine/engine_role.py).

The server asks its role where to listen and where its statistics come from, and calls it
at three points of its life: once the models are loaded and the adapters listen (`start`),
and at shutdown, first (`close_first`, before the adapters stop) and last (`close_last`,
once the metrics endpoint is down). A server of its own has the base role, whose answers
are a lone server's and whose hooks do nothing. The roles live with what they are
(workers/, engine/), above this package: the server knows neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.dataplane.plane import DataPlane
from inferd.dataplane.statistics_api import ProviderFactory
from inferd.dataplane.unary import SignatureChecks
from inferd.metrics.prometheus import MetricsSink
from inferd.protocol import tls
from inferd.repository.registry import ModelRegistry
from inferd.settings import Settings, TlsFiles
from inferd.telemetry.statistics import ProcessStatistics


@dataclass(frozen=True, slots=True)
class GrpcAddress:
    host: str
    port: int
    tls: TlsFiles | None
    reuse_port: bool = False  # the port is shared with the other processes of --workers N


class ServerRole:
    """A server of its own."""

    processes = 1  # the server processes that serve the repository
    serves_metrics = True  # the process serves /metrics itself (a worker's supervisor does)
    exports_host = True  # the process exports the host's CPU and memory (--metrics-triton-names)

    def statistics(self) -> ProviderFactory:
        """Where the whole server's statistics come from: this process's own."""
        return ProcessStatistics

    def signature_checks(self, registry: ModelRegistry) -> SignatureChecks | None:
        """Whose signature checks a request may carry (--engine's front ends'), or None."""
        return None

    def http_where(self, settings: Settings) -> dict[str, Any]:
        """uvicorn's options saying where HTTP listens."""
        where: dict[str, Any] = {"host": settings.host, "port": settings.http_port}
        where.update(tls.uvicorn_options(settings.http_tls))
        return where

    def grpc_address(self, settings: Settings, port: int) -> GrpcAddress:
        return GrpcAddress(settings.host, port, settings.grpc_tls)

    def listening(self, settings: Settings, ready: bool) -> str:
        """The log line that says the server is up."""
        return (
            f"HTTP server listening on http://{settings.host}:{settings.http_port} (ready: {ready})"
        )

    async def start(self, dataplane: DataPlane, metrics: MetricsSink | None) -> None:
        """Models are loaded and the adapters listen."""

    async def close_first(self) -> None:
        """Shutdown's first step, before the adapters stop."""

    async def close_last(self) -> None:
        """Shutdown's last step, once the metrics endpoint is down."""
