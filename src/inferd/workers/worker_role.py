"""One of `--workers N`: a whole server (server/build.py) on the ports it shares with its
siblings, whose statistics are the sum of every worker's, and that answers its siblings'
questions on a socket of its own (peers.py). Its supervisor serves /metrics and the host's
numbers, from every worker's peer socket."""

from __future__ import annotations

import functools

from inferd.dataplane.plane import DataPlane
from inferd.dataplane.statistics_api import ProviderFactory
from inferd.limits import ensure_file_descriptors
from inferd.metrics.prometheus import MetricsSink
from inferd.server import build
from inferd.server.role import GrpcAddress, ServerRole
from inferd.settings import Settings
from inferd.workers.peers import PeerServer, WorkerSlot
from inferd.workers.reuse_port import reuse_port_socket
from inferd.workers.worker_statistics import WorkersStatistics


class WorkerRole(ServerRole):
    serves_metrics = False  # the supervisor does
    exports_host = False  # the supervisor does, once

    def __init__(self, slot: WorkerSlot) -> None:
        self.slot = slot
        self.processes = slot.count
        self.peer_server: PeerServer | None = None

    def statistics(self) -> ProviderFactory:
        return functools.partial(WorkersStatistics, slot=self.slot)

    def grpc_address(self, settings: Settings, port: int) -> GrpcAddress:
        return GrpcAddress(settings.host, port, settings.grpc_tls, reuse_port=True)

    async def start(self, dataplane: DataPlane, metrics: MetricsSink | None) -> None:
        statistics = dataplane.statistics
        self.peer_server = PeerServer(
            self.slot,
            lambda name, version: statistics.model_statistics(name, version)["model_stats"],
            None if metrics is None else metrics.prometheus.collect,
        )
        await self.peer_server.start()

    async def close_last(self) -> None:
        if self.peer_server is not None:
            await self.peer_server.close()


def run_worker(settings: Settings, slot: WorkerSlot) -> None:
    """One of `--workers N`: the same server on a port it shares with its siblings."""
    ensure_file_descriptors(settings.limits)  # before the port is bound, as a server does
    sock = reuse_port_socket(settings)
    build.run(settings, WorkerRole(slot), sock)
