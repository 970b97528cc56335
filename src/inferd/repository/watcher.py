"""Poll mode: notice added, removed and changed models in the repository and apply them.

Each round compares every model directory's stat fingerprint with the one seen at its last
(re)load; only a moved fingerprint triggers a reload, and the reload itself only swaps
versions whose content checksum changed.
"""

from __future__ import annotations

import asyncio
import logging

from inferd.repository.checksum import fingerprint
from inferd.repository.registry import ModelRegistry

log = logging.getLogger("inferd.repository.watcher")


class RepositoryPoller:
    def __init__(self, registry: ModelRegistry, interval_s: float) -> None:
        self._registry = registry
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll_once()
            except Exception:
                log.exception("polling the model repository failed; trying again next round")

    async def poll_once(self) -> None:
        registry = self._registry
        on_disk = set(await asyncio.to_thread(registry.model_names_on_disk))
        for name in sorted(set(registry.models) - on_disk):
            log.info("model %s was removed from the repository: unloading it", name)
            await registry.unload_model(name, forget=True)
        for name in sorted(on_disk):
            model = registry.models.get(name)
            seen = await asyncio.to_thread(fingerprint, registry.repository / name)
            if model is None or seen != model.seen:
                log.info("model %s %s: loading", name, "is new" if model is None else "changed")
                await registry.load_all([name])
