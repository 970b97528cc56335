"""The engine of `--workers N --engine`: the whole server (server/build.py), its adapters on
unix sockets in the supervisor's private directory for the front ends, and the hop they send
inference over (engine_hop.py), with the model table whose checks they share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferd.dataplane.plane import DataPlane
from inferd.engine import sockets
from inferd.engine.engine_hop import EngineHop
from inferd.engine.front_end_series import FrontEndCollector
from inferd.engine.model_table import ModelTable
from inferd.metrics.prometheus import MetricsSink
from inferd.repository.registry import ModelRegistry
from inferd.server import build
from inferd.server.role import GrpcAddress, ServerRole
from inferd.settings import Settings


class EngineRole(ServerRole):
    def __init__(self, directory: Path, front_ends: int) -> None:
        self.directory = directory
        self.front_ends = front_ends
        self.table: ModelTable | None = None
        self.hop: EngineHop | None = None

    def signature_checks(self, registry: ModelRegistry) -> ModelTable:
        self.table = ModelTable(registry.models)
        return self.table

    def http_where(self, settings: Settings) -> dict[str, Any]:
        return {"uds": str(sockets.http(self.directory))}  # for the front ends: no TLS inside

    def grpc_address(self, settings: Settings, port: int) -> GrpcAddress:
        return GrpcAddress(f"unix:{sockets.grpc(self.directory)}", 0, None)

    def listening(self, settings: Settings, ready: bool) -> str:
        return f"engine serving its front ends (ready: {ready})"

    async def start(self, dataplane: DataPlane, metrics: MetricsSink | None) -> None:
        assert self.table is not None  # the server asked for it when it built its DataPlane
        self.hop = EngineHop(dataplane, self.table, sockets.hop(self.directory))
        if metrics is not None:
            metrics.prometheus.register(FrontEndCollector(self.hop, self.front_ends))
        await self.hop.start()

    async def close_first(self) -> None:
        if self.hop is not None:
            await self.hop.close()  # the front ends stopped (and drained) first


def run_engine(settings: Settings, directory: Path) -> None:
    """The engine process: the whole server, for `settings.workers` front ends."""
    build.run(settings, EngineRole(directory, settings.workers))
