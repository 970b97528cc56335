"""Triton's statistics extension as the APIs answer it: this process's counts (the
telemetry sink's, telemetry/statistics.py) in Triton's shape, and the whole server's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferd.errors import not_found
from inferd.events import Gone
from inferd.reliability.degrade.controller import degradation_statistics
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.statistics import (
    LocalStatistics,
    ProcessStatistics,
    StatisticsProvider,
    StatisticsSink,
)

# The whole server's statistics from this process's: its own alone (one process), or every
# worker's of `--workers N` (workers/worker_statistics.py), chosen by the server.
ProviderFactory = Callable[[LocalStatistics], StatisticsProvider]


class Statistics:
    def __init__(
        self,
        registry: ModelRegistry,
        sink: StatisticsSink,
        provider: ProviderFactory = ProcessStatistics,
    ) -> None:
        self.registry = registry
        self.sink = sink
        self.provider = provider(self.model_statistics)

    def forget(self, gone: Gone) -> None:
        """Versions unloaded: their counts here, and what the provider kept of them."""
        self.sink.forget(gone)
        self.provider.forget(gone)

    async def server_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """`model_statistics` of the whole server."""
        return await self.provider.model_statistics(name, version)

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of this process: every model when `name` is empty, else its
        (given) versions."""
        if not name:
            names = sorted(self.registry.models)
        elif name not in self.registry.models:
            raise not_found(f"unknown model '{name}'")
        else:
            names = [name]
        stats = []
        for n in names:
            versions = sorted(self.registry.models[n].versions, key=int)
            if version:
                if version not in versions:
                    raise not_found(f"unknown version '{version}' of model '{n}'")
                versions = [version]
            entries = self.sink.model_stats(n, versions)
            model = self.registry.models[n]
            for entry in entries:  # inferd's own field (HTTP; gRPC's message has none)
                mv = model.versions.get(entry["version"])
                if mv is not None and mv.cache is not None:
                    entry["coalesced"] = self.sink.coalesced(n, entry["version"])
                if mv is not None and mv.signature.ragged.padding is not None:
                    entry["padding"] = self.sink.padding(n, entry["version"])
            degrade = model.degrade
            if degrade is not None:  # inferd's own field (HTTP; gRPC's message has none)
                for entry in entries:
                    entry["degradation"] = degradation_statistics(degrade)
            stats.extend(entries)
        return {"model_stats": stats}
