"""Redis servers the cache tests own: a redis-server on a free port they can kill and
restart, and a listener that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from tests.support.server_process import free_port

MAIN_REDIS = ("127.0.0.1", 6379)  # always running here and in CI


class OwnRedis:
    """`redis-server --port P` (no persistence), started and stopped by the test; started
    again on the same port after a kill. `preexec_fn` runs in its child before the exec
    (the soak's: die with the soak)."""

    def __init__(
        self, port: int | None = None, preexec_fn: Callable[[], None] | None = None
    ) -> None:
        self.port = port or free_port()
        self.preexec_fn = preexec_fn
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=self.preexec_fn,
        )  # fmt: skip
        client = redis.Redis("127.0.0.1", self.port, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        try:
            while True:  # until it answers PING, or the deadline
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} exited")
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not answer")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


@contextmanager
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port whose connections are accepted (by the kernel's backlog) and never answered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]
