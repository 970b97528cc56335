"""Triton's statistics of the whole server with `--workers N`: every worker's summed (a
statistics call lands on one worker; clients read deltas of these numbers). One process's
own are telemetry/statistics.py's `ProcessStatistics`; both are a `StatisticsProvider`."""

from __future__ import annotations

import asyncio
from typing import Any

from inferd.events import Gone
from inferd.telemetry.statistics import LocalStatistics
from inferd.workers import peers


class WorkersStatistics:
    """One of `--workers N`: its own statistics and its siblings', asked over their sockets."""

    def __init__(self, local: LocalStatistics, slot: peers.WorkerSlot) -> None:
        self.local = local
        self.slot = slot
        self._last: dict[tuple[int, str, str], list[dict[str, Any]]] = {}

    async def model_statistics(self, name: str, version: str) -> dict[str, Any]:
        local = self.local(name, version)
        question = {"op": "stats", "model": name, "version": version}
        siblings = self.slot.siblings()
        answers = await asyncio.gather(
            *(peers.ask(self.slot.socket_path(i), question) for i in siblings)
        )
        lists = [local["model_stats"]]
        for i, answer in zip(siblings, answers, strict=True):
            key = (i, name, version)
            if answer is not None and "stats" in answer:
                self._last[key] = answer["stats"]
            # A sibling that cannot answer now (busy, restarting) counts with its last
            # answer: clients read deltas, and a total that drops would read as negative.
            lists.append(self._last.get(key, []))
        return {"model_stats": peers.merge_model_stats(lists)}

    def forget(self, gone: Gone) -> None:
        """The siblings' last answers about versions (and models) that are gone."""
        for key in list(self._last):
            _, name, version = key
            if name and gone(name, version):
                del self._last[key]
