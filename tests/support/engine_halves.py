"""The two halves of `--workers N --engine` apart, for a test that looks inside one of them:
the engine (engine_role.run_engine) as its own process and a front end (front_end.FrontEnd)
in a thread of the test's process, or the other way round. They meet over a private
directory, as the supervisor's children do (engine/supervisor.py); each half is stopped at
the end of its block, on failure too.

A half that runs as a process is spawned (a fresh interpreter: forking a test process that
has threads is unsafe) and gets SIGTERM at the end, as from the supervisor: it drains and
exits. One that runs in a thread is what a counter in this process sees
(tests/support/call_counter.profiled_threads: start the half inside its block).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import uvicorn

from inferd.engine.engine_role import EngineRole, run_engine
from inferd.engine.front_end import FrontEnd, run_front_end
from inferd.server.build import InferenceServer, access_policy
from inferd.settings import Settings
from inferd.workers.supervisor import _die_with_parent
from tests.support.server_process import free_port, wait_until_serving

START_S = 60.0


@dataclass
class FrontEndAt:
    """Where a front end answers (tests/support/call_budget.Endpoints)."""

    port: int
    grpc_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def _settings(**settings: Any) -> Settings:
    # One front end; no metrics port (the engine's would serve the front ends' series).
    return Settings(workers=1, engine=True, metrics_port=None, log_level="WARNING", **settings)


def _child(run: Callable[..., None], *args: Any) -> None:
    """A spawned half's entry point: it dies with the test process, as with the supervisor."""
    _die_with_parent()
    run(*args)


@contextlib.contextmanager
def _process(name: str, run: Callable[..., None], *args: Any) -> Iterator[BaseProcess]:
    proc = multiprocessing.get_context("spawn").Process(target=_child, args=(run, *args), name=name)
    proc.start()
    try:
        yield proc
    finally:
        if proc.is_alive():
            proc.terminate()  # SIGTERM: a graceful stop
            proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=30)


@contextlib.contextmanager
def _thread(
    uv: uvicorn.Server, what: str, alive: Callable[[], str | None], **run: Any
) -> Iterator[None]:
    """`uv` served in a thread of this process until the block ends; RuntimeError, naming
    `what`, if it does not start within START_S or the other half (`alive`: why it is not)
    dies meanwhile."""
    thread = threading.Thread(target=uv.run, kwargs=run, daemon=True, name=what)
    thread.start()
    try:
        deadline = time.monotonic() + START_S
        while not uv.started:
            gone = alive()
            if gone is not None:
                raise RuntimeError(f"{what} did not start: {gone}")
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start within {START_S:g} s")
            time.sleep(0.02)
        yield
    finally:
        uv.should_exit = True
        # One that never started may be stuck in its startup (a front end retrying an engine
        # that is gone): a daemon thread, left behind rather than waited for.
        thread.join(timeout=30 if uv.started else 1)


@contextlib.contextmanager
def engine_process(repository: Path, directory: Path) -> Iterator[BaseProcess]:
    """The engine of `repository` as its own process, serving its front ends in `directory`."""
    settings = _settings(model_repository=repository, grpc_port=0)  # gRPC: a unix socket
    with _process("inferd-engine", run_engine, settings, directory) as proc:
        yield proc


@contextlib.contextmanager
def front_end_thread(directory: Path, engine: BaseProcess) -> Iterator[FrontEndAt]:
    """A front end of the engine in `directory` (`engine`: its process), in a thread of this
    process on free loopback ports, serving once it has reached the engine."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = _settings(http_port=port, grpc_port=0)
    front = FrontEnd(settings, directory, access_policy(settings))

    def engine_gone() -> str | None:
        return None if engine.is_alive() else f"the engine exited with {engine.exitcode}"

    try:
        uv = uvicorn.Server(front.uvicorn_config())
        with _thread(uv, "the front end", engine_gone, sockets=[sock]):
            assert front.grpc_port, "the front end serves no gRPC"
            yield FrontEndAt(port, front.grpc_port)
    finally:
        sock.close()


@contextlib.contextmanager
def engine_thread(repository: Path, directory: Path) -> Iterator[InferenceServer]:
    """The engine of `repository` in a thread of this process, serving its front ends in
    `directory` once its models are loaded."""
    settings = _settings(model_repository=repository, grpc_port=0)
    server = InferenceServer(settings, EngineRole(directory, settings.workers))
    with _thread(uvicorn.Server(server.uvicorn_config()), "the engine", lambda: None):
        yield server


@contextlib.contextmanager
def front_end_process(directory: Path) -> Iterator[FrontEndAt]:
    """A front end of the engine in `directory` as its own process, on free ports, once it
    answers ready (through the engine)."""
    at = FrontEndAt(free_port(), free_port())
    settings = _settings(http_port=at.port, grpc_port=at.grpc_port)
    with _process("inferd-front-end-0", run_front_end, settings, directory, 0) as proc:
        assert proc.pid is not None
        wait_until_serving(proc.pid, at.port, exit_code=lambda: proc.exitcode, timeout_s=START_S)
        yield at
