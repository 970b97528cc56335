"""`inferd serve --print-openapi`: the OpenAPI document a server with these settings would
serve, without serving: the server is built and its models loaded (each model's request
comes from its loaded config), no port is opened, and the models are unloaded again."""

from __future__ import annotations

import asyncio

from inferd.backends.python import model_prints
from inferd.server.build import InferenceServer
from inferd.server.role import ServerRole
from inferd.settings import Settings


class _Processes(ServerRole):
    """A lone server, but of `processes` (the document leaves out what --workers N cannot
    serve: shared-memory registration)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes


def openapi_document(settings: Settings) -> bytes:
    # --workers N --engine: the engine, one process, answers every route but infer.
    processes = 1 if settings.engine else settings.workers
    server = InferenceServer(settings, _Processes(processes))
    return asyncio.run(_loaded_document(server))


async def _loaded_document(server: InferenceServer) -> bytes:
    model_prints.install()  # a model's print() goes to the log, never into the document
    server.model_host.bind_loop(asyncio.get_running_loop())
    try:
        await server.load_models()
        assert server.app.openapi is not None
        return server.app.openapi.json()
    finally:
        await server.registry.unload_all()
        server.offload.close()
