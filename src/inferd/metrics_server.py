"""`GET /metrics` on its own port: two threads in all, whatever the clients do.

prometheus_client's `start_http_server` spends a thread on each connection and has no
timeouts, so idle connections to the metrics port held threads (and memory) for ever. This
server runs one asyncio loop on its own thread for every connection, with the server's
header timeout on each request, a cap on open connections and a bounded request head; the
exposition text is made on a second thread, one scrape at a time (collectors read the
registry's state and, under the workers' supervisor, ask every worker: that may block, the
loop must not). What Prometheus asks for is honoured as prometheus_client did: the
OpenMetrics format when its Accept header prefers it, gzip when accepted, `name[]` filters.

The server runs apart from the serving event loop, so the supervisor of `--workers N`, which
has no loop, uses it too.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from inferd.limits import DEFAULT_LIMITS, Limits

log = logging.getLogger("inferd.metrics")

MAX_CONNECTIONS = 64  # a few scrapers and dashboards; more get 503 and are closed
MAX_HEAD_BYTES = 8192
PATH = "/metrics"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class MetricsServer:
    """Serves `registry` on host:port until `close`. Binding happens here, so a port in use
    fails at once, in the caller."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.registry = registry
        self.limits = limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family)
        self.port = int(self._socket.getsockname()[1])
        self._collector = ThreadPoolExecutor(1, thread_name_prefix="metrics-collect")
        self._open = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="metrics", daemon=True
        )
        self._thread.start()
        started.wait()

    def close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=5)
        self._collector.shutdown(wait=False, cancel_futures=True)

    def _run(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(started))
        finally:
            loop.close()

    async def _main(self, started: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, sock=self._socket, limit=MAX_HEAD_BYTES)
        started.set()
        async with server:
            await self._stop.wait()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            await self._reply(writer, 503, b"too many connections to the metrics port\n")
            writer.close()
            return
        self._open += 1
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or sent or read too slowly
        finally:
            self._open -= 1
            self._handlers.discard(task)
            writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; True to read another on this connection."""
        timeout = self.limits.header_timeout_s
        try:
            async with asyncio.timeout(timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # closed by the client (between requests, as usual)
        except asyncio.LimitOverrunError:
            await self._reply(writer, 431, b"request head too large\n")
            return False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._reply(writer, 400, b"malformed request line\n")
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            await self._reply(writer, 400, b"a metrics request has no body\n")
            return False
        path, _, query = target.partition("?")
        if path != PATH:
            await self._reply(writer, 404, f"not found: {path}; metrics are at {PATH}\n".encode())
            return keep_alive
        if method not in ("GET", "HEAD"):
            await self._reply(writer, 405, f"{method} {PATH}: use GET\n".encode())
            return keep_alive
        params = parse_qs(query)
        unknown = sorted(set(params) - {"name[]"})
        if unknown:
            message = f"unknown query parameter '{unknown[0]}'; only name[] is supported\n"
            await self._reply(writer, 400, message.encode())
            return keep_alive
        body, content_type, gzipped = await asyncio.get_running_loop().run_in_executor(
            self._collector,
            self._render,
            headers.get("accept", ""),
            headers.get("accept-encoding", ""),
            params.get("name[]"),
        )
        extra = [f"content-type: {content_type}"] + (["content-encoding: gzip"] if gzipped else [])
        await self._reply(writer, 200, body, extra, keep_alive, head_only=method == "HEAD")
        return keep_alive

    def _render(
        self, accept: str, accept_encoding: str, names: list[str] | None
    ) -> tuple[bytes, str, bool]:
        encoder, content_type = choose_encoder(accept)
        output = encoder(self.registry if names is None else _Only(self.registry, set(names)))
        if "gzip" in accept_encoding.lower():
            return gzip.compress(output), content_type, True
        return output, content_type, False

    async def _reply(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        extra: list[str] | None = None,
        keep_alive: bool = False,
        head_only: bool = False,
    ) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS[status]}", f"content-length: {len(body)}"]
        if extra is None:
            lines.append("content-type: text/plain; charset=utf-8")
        else:
            lines += extra
        if not keep_alive:
            lines.append("connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)
        # A client that does not read its answer is dropped, not waited for.
        async with asyncio.timeout(self.limits.header_timeout_s):
            await writer.drain()


class _Only(Collector):
    """The families of `registry` named in `names` (`?name[]=`), by family or sample name.
    (prometheus_client's restricted_registry finds only collectors that describe
    themselves, which inferd's scrape-time collectors do not.)"""

    def __init__(self, registry: CollectorRegistry, names: set[str]) -> None:
        self.registry = registry
        self.names = names

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.name in self.names or any(s.name in self.names for s in family.samples):
                yield family
