"""Run a real inferd server (uvicorn over a loopback socket) in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.scheduler import Scheduler
from inferd.scheduling.sequence.sequence_batcher import SequenceBatcher
from inferd.server.build import InferenceServer
from inferd.settings import Settings
from tests.support.server_process import check_port_free, free_port, wait_until_serving

__all__ = ["free_port"]  # the tests take it from here


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:PORT
    port: int
    server: InferenceServer

    @property
    def metrics_url(self) -> str:
        assert self.server.metrics_server, "this server has no metrics endpoint"
        return f"http://127.0.0.1:{self.server.metrics_server.port}/metrics"

    @property
    def grpc_address(self) -> str:
        assert self.server.grpc_port, "this server has no gRPC endpoint"
        return f"127.0.0.1:{self.server.grpc_port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)


@contextlib.contextmanager
def run_server(repository: Path, **settings: Any) -> Iterator[RunningServer]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings.setdefault("grpc_port", 0)  # any free port
    settings.setdefault("metrics_port", 0)
    server = InferenceServer(
        Settings(model_repository=repository, http_port=port, log_level="WARNING", **settings)
    )
    uv = uvicorn.Server(server.uvicorn_config())
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("inferd test server did not start")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", port, server)
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sock.close()


def batcher_of(server: RunningServer, model: str) -> DynamicBatcher:
    batcher = server.server.registry.get(model).batcher
    assert isinstance(batcher, DynamicBatcher), f"model '{model}' has no dynamic batcher"
    return batcher


def sequence_batcher_of(server: RunningServer, model: str) -> SequenceBatcher:
    batcher = server.server.registry.get(model).batcher
    assert isinstance(batcher, SequenceBatcher), f"model '{model}' has no sequence batcher"
    return batcher


B = TypeVar("B", bound=Scheduler)


# Tests that need requests queued in a given order wait on the server's own state (queue
# depth, requests in flight), never on the clock: a slow machine delays, it cannot reorder.
STATE_DEADLINE_S = 30.0


def _check_deadline(batcher: Scheduler, what: str, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise AssertionError(
            f"model '{batcher.name}': {what} not reached within {STATE_DEADLINE_S:.0f} s "
            f"(inflight={batcher.inflight()}, queue_depth={batcher.queue_depth()})"
        )


def wait_for(batcher: B, condition: Callable[[B], bool], what: str) -> None:
    """Poll until `condition(batcher)` holds; fail, naming `what`, at the deadline."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not condition(batcher):
        _check_deadline(batcher, what, deadline)
        time.sleep(0.002)


async def until(
    batcher: DynamicBatcher,
    condition: Callable[[DynamicBatcher], bool],
    what: str,
    *pending: asyncio.Task[httpx.Response],
) -> None:
    """`wait_for` for a client on an event loop; it also fails at once if a request of
    `pending`, which should still be waiting, was answered."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not condition(batcher):
        for task in pending:
            if task.done():
                r = task.result()
                raise AssertionError(
                    f"waiting for {what}: a request was answered early: {r.status_code} {r.text}"
                )
        _check_deadline(batcher, what, deadline)
        await asyncio.sleep(0.002)


@dataclass
class CliServer:
    """`inferd serve` as its own process, the way a user runs it."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=timeout_s)


@contextlib.contextmanager
def run_cli_server(
    repository: Path, log_path: Path, *args: str, http_port: int | None = None
) -> Iterator[CliServer]:
    """Start `python -m inferd serve` (extra CLI `args` as given) on a free HTTP port (or
    `http_port`, which must be free), with gRPC and metrics off unless `args` name their
    ports, wait until it is ready (and is the one answering: tests/support/server_process.py), and
    stop it afterwards. Its output goes to `log_path`: a file, never a pipe nobody reads,
    which could fill up and block the server."""
    port = free_port() if http_port is None else http_port
    check_port_free(port)
    defaults = [
        arg for option in ("--grpc-port", "--metrics-port") if option not in args
        for arg in (option, "0")
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository),
                "--http-port", str(port), *defaults, *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        server = CliServer(f"http://127.0.0.1:{port}", proc, log_path)
        try:
            wait_until_serving(
                proc.pid, port, exit_code=proc.poll, output=server.output, timeout_s=60
            )
            yield server
        finally:
            if proc.poll() is None:
                proc.terminate()  # graceful: a --workers supervisor cleans up after itself
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.wait(timeout=30)
