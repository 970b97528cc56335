"""`GET /metrics` on its own port, off the event loop, on two threads whatever the clients do.

Always Prometheus' text format 0.0.4, as Triton serves it (whatever the Accept header asks),
so Triton's counter names can stay counters: prometheus_client's own endpoint would name a
counter's TYPE line `<name>_total`, leaving Triton's bare-named samples untyped, and its
OpenMetrics output has no way to spell a counter without `_total` at all.

A thread per connection with no timeouts (http.server's ThreadingHTTPServer, as
prometheus_client's own server) let idle connections hold threads and memory for ever. This
server runs one asyncio loop on its own thread for every connection, with the server's
header timeout on each request (`--header-timeout-secs`, also between requests), a cap on
open connections and a bounded request head; the exposition text is made on a second thread,
one scrape at a time (collectors read the registry's state and, under the workers'
supervisor, ask every worker: that may block, the loop must not). It runs apart from the
serving event loop, so the supervisor of `--workers N`, which has no loop, uses it too.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.core import Metric
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
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class _One(Collector):
    """One family, as the collector generate_latest expects."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


def _bare_counter(family: Metric) -> bool:
    """A counter whose samples carry the family's own name, as Triton's (nv_inference_count),
    rather than prometheus_client's `<name>_total`."""
    return family.type == "counter" and any(s.name == family.name for s in family.samples)


def exposition(registry: Collector) -> bytes:
    """The registry's families in text format 0.0.4, a bare-named counter typed a counter."""
    parts = []
    for family in registry.collect():
        if not _bare_counter(family):
            parts.append(generate_latest(_One(family)))
            continue
        # Written as a gauge (same lines, the name kept), then typed back as a counter.
        gauge = Metric(family.name, family.documentation, "gauge")
        gauge.samples = family.samples
        text = generate_latest(_One(gauge))
        type_line = f"# TYPE {family.name} gauge\n".encode()
        parts.append(text.replace(type_line, f"# TYPE {family.name} counter\n".encode(), 1))
    return b"".join(parts)


class MetricsServer:
    """Serves `registry` at `http://host:port/metrics` until closed. Binding happens here, so
    a port in use fails at once, in the caller."""

    def __init__(
        self, registry: Collector, host: str, port: int, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.registry = registry
        self.limits = limits
        # The family the host names (an IPv6 address needs AF_INET6).
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self._socket = socket.create_server((host, port), family=infos[0][0])
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
        if query:
            names = sorted({k for k, _ in parse_qsl(query, keep_blank_values=True)})
            message = f"unsupported query parameter(s): {', '.join(names)}\n"
            await self._reply(writer, 400, message.encode())
            return keep_alive
        gzipped = "gzip" in headers.get("accept-encoding", "").lower()
        try:
            body = await asyncio.get_running_loop().run_in_executor(
                self._collector, self._render, gzipped
            )
        except Exception:
            # A bug in a collector: logged with its traceback, the scrape fails visibly
            # (Prometheus marks the target down) and the endpoint keeps serving.
            log.exception("collecting metrics failed")
            await self._reply(writer, 500, b"collecting metrics failed; see the server log\n")
            return keep_alive
        extra = [f"content-type: {CONTENT_TYPE_PLAIN_0_0_4}"]
        if gzipped:
            extra.append("content-encoding: gzip")
        await self._reply(writer, 200, body, extra, keep_alive, head_only=method == "HEAD")
        return keep_alive

    def _render(self, gzipped: bool) -> bytes:
        output = exposition(self.registry)
        return gzip.compress(output) if gzipped else output

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
