"""`GET /metrics` on its own port, from threads of its own (off the event loop).

Always Prometheus' text format 0.0.4, as Triton serves it (whatever the Accept header asks),
so Triton's counter names can stay counters: prometheus_client's own endpoint would name a
counter's TYPE line `<name>_total`, leaving Triton's bare-named samples untyped, and its
OpenMetrics output has no way to spell a counter without `_total` at all.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger("inferd.metrics")


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


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        if url.path != "/metrics":
            self._reply(404, b"not found: metrics are at /metrics\n")
            return
        if url.query:
            names = sorted({k for k, _ in parse_qsl(url.query, keep_blank_values=True)})
            self._reply(400, f"unsupported query parameter(s): {', '.join(names)}\n".encode())
            return
        try:
            body = exposition(self.server.registry)
        except Exception:
            # A bug in a collector: logged with its traceback, the scrape fails visibly
            # (Prometheus marks the target down) and the endpoint keeps serving.
            log.exception("collecting metrics failed")
            self._reply(500, b"collecting metrics failed; see the server log\n")
            return
        self._reply(200, body, CONTENT_TYPE_PLAIN_0_0_4)

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        gzipped = "gzip" in self.headers.get("Accept-Encoding", "") and status == 200
        if gzipped:
            body = gzip.compress(body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a scrape every few seconds is not news."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck scrape never holds up shutdown

    def __init__(self, host: str, port: int, registry: Collector) -> None:
        # The family the host names (an IPv6 address needs AF_INET6).
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self.address_family = infos[0][0]
        self.registry = registry
        super().__init__((host, port), _Handler)


class MetricsServer:
    """Serves `registry` at `http://host:port/metrics` until closed."""

    def __init__(self, registry: Collector, host: str, port: int) -> None:
        self._server = _Server(host, port, registry)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="inferd-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
