"""What the soak watches beside its traffic: readiness (polled over HTTP and gRPC, a new
connection each time, so that every `--workers` process is asked in turn), the resident
memory, open file descriptors and threads of every server process (read from /proc), and
the server's /metrics (the cache tier's counts, failures by reason, worker restarts).

`slope_per_hour` is the least-squares slope of a series, the measure of "flat".
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.soak_processes import family, start_time

PROBE_TIMEOUT_S = 5.0


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, in value per hour (0 for < 2 points)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600.0


# -- readiness ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    at: float
    protocol: str
    ready: bool | None  # None: no answer within PROBE_TIMEOUT_S
    detail: str = ""


def get(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """GET on a new connection: (status, body); OSError when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (loopback)
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")


def probe_http(port: int, models: list[str]) -> tuple[bool | None, str]:
    """GET /v2/health/ready on a new connection; when not ready, which models say so (each
    asked on a connection of its own: they may reach another worker, so this names
    suspects, not a verdict)."""
    url = f"http://127.0.0.1:{port}"
    try:
        status, body = get(f"{url}/v2/health/ready")
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if status == 200:
        return True, ""
    unready = []
    for model in models:
        with contextlib.suppress(OSError):
            code, text = get(f"{url}/v2/models/{model}/ready")
            if code != 200:
                unready.append(f"{model} {code} {text[:120]}")
    return False, f"{status} {body[:200]}; models not ready: {unready or 'none seen'}"


def probe_grpc(port: int) -> tuple[bool | None, str]:
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return None, "no answer"
        return False, f"{code.name}: {exc.details()}"
    return bool(answer.ready), "" if answer.ready else "ServerReady answered ready: false"


# -- processes ---------------------------------------------------------------------------------


@dataclass
class ProcessSeries:
    pid: int
    role: str
    first_seen: float
    started: int | None
    # t, rss KiB, descriptors (open client connections not counted), threads, open client
    # connections
    samples: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    gone: float | None = None


TCP_ESTABLISHED = "01"


def client_connections(ports: set[int]) -> set[str]:
    """The socket inodes of the established TCP connections accepted on `ports` (any process).

    With `--workers N` a client's keep-alive connection stays with the worker that accepted
    it: when a sibling is killed its clients reconnect, land on the survivors (the kernel's
    SO_REUSEPORT choice) and stay there after it is back. Those are the clients' descriptors,
    as many as the soak holds open, not the server's: counted apart, so that "descriptors
    flat" is about what the server itself opens. A connection the client closed and the
    server did not (CLOSE_WAIT) is not established and stays counted: that is a leak."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == TCP_ESTABLISHED and int(f[1].rsplit(":", 1)[1], 16) in ports:
                inodes.add(f[9])
    return inodes


def read_process(pid: int, clients: set[str] | None = None) -> tuple[int, int, int, int] | None:
    """(RSS KiB, open descriptors but the client connections in `clients`, threads, client
    connections), None once it is gone."""
    try:
        rss = threads = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                return None  # killed, not yet reaped: no memory, no descriptors; not a sample
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError):
        return None
    connections = 0
    if clients:
        for fd in fds:
            with contextlib.suppress(OSError):  # closed since the listing
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in clients:
                    connections += 1
    return rss, len(fds) - connections, threads, connections


# -- metrics -----------------------------------------------------------------------------------

WATCHED = (
    "inferd_cache_hits_total", "inferd_cache_misses_total", "inferd_cache_errors_total",
    "inferd_cache_breaker_skips_total", "inferd_cache_dropped_inserts_total",
    "inferd_cache_inserts_total", "inferd_request_failure_total", "inferd_worker_restarts_total",
    "inferd_cache_coalesced_total",
)  # fmt: skip


def scrape(
    port: int,
) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, int]]:
    """The WATCHED samples, and how many samples the endpoint exported per `worker` label
    ("" for the supervisor's own): a count that keeps growing is a leak of label sets
    (series of versions long unloaded, say)."""
    status, text = get(f"http://127.0.0.1:{port}/metrics", timeout_s=30)
    if status != 200:
        raise ValueError(f"/metrics answered {status}: {text[:200]}")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    counts: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # The supervisor's own families (inferd_workers*, inferd_worker_restarts) carry
            # a worker label but are the supervisor's, there while the worker is not.
            own = s.name.startswith("inferd_worker")
            worker = "" if own else s.labels.get("worker", "")
            counts[worker] = counts.get(worker, 0) + 1
            if s.name in WATCHED:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out, counts


def increase(
    series: list[tuple[float, float]],
    since: float = 0.0,
    skip: Callable[[float, float], bool] | None = None,
) -> float:
    """A counter's increase over the samples at or after `since`, across resets (a restarted
    worker counts from 0), as Prometheus' increase() does; without the intervals between
    two samples for which `skip(t0, t1)` is true."""
    points = [(t, v) for t, v in series if t >= since]
    total = 0.0
    for (t0, before), (t1, after) in zip(points, points[1:], strict=False):
        if skip is None or not skip(t0, t1):
            total += after - before if after >= before else after
    return total


# -- the watcher thread ------------------------------------------------------------------------


@dataclass
class Watch:
    """Polls readiness every `probe_every_s`, reads every server process every
    `sample_every_s` and scrapes /metrics every `scrape_every_s`, until `stop` is set."""

    supervisor_pid: int
    http_port: int
    grpc_port: int
    metrics_port: int
    models: list[str]
    probe_every_s: float
    sample_every_s: float
    scrape_every_s: float
    stop: threading.Event
    probes: list[Probe] = field(default_factory=list)
    processes: dict[int, ProcessSeries] = field(default_factory=dict)
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = field(
        default_factory=dict
    )
    scrape_errors: list[str] = field(default_factory=list)
    series_counts: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    redis_pid: Callable[[], int | None] = lambda: None
    redis_samples: list[tuple[float, int]] = field(default_factory=list)

    def threads(self) -> list[threading.Thread]:
        return [
            threading.Thread(
                target=self._every, args=(self.probe_every_s, self._probe), daemon=True
            ),
            threading.Thread(
                target=self._every, args=(self.sample_every_s, self._sample), daemon=True
            ),
            threading.Thread(
                target=self._every, args=(self.scrape_every_s, self._scrape), daemon=True
            ),
        ]

    def _every(self, period_s: float, job: Callable[[], None]) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            job()
            next_at += period_s
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def _probe(self) -> None:
        # Alternate the protocols; each probe on a new connection reaches either worker.
        protocol = "http" if len(self.probes) % 2 == 0 else "grpc"
        at = time.monotonic()
        if protocol == "http":
            ready, detail = probe_http(self.http_port, self.models)
        else:
            ready, detail = probe_grpc(self.grpc_port)
        self.probes.append(Probe(at, protocol, ready, detail))

    def sample_now(self) -> None:
        self._sample()

    def _sample(self) -> None:
        now = time.monotonic()
        roles = family(self.supervisor_pid)
        clients = client_connections({self.http_port, self.grpc_port, self.metrics_port})
        for pid, role in roles.items():
            values = read_process(pid, clients)
            if values is None:
                continue
            series = self.processes.get(pid)
            if series is None:
                series = self.processes[pid] = ProcessSeries(pid, role, now, start_time(pid))
            series.samples.append((now, *values))
        for pid, series in self.processes.items():
            if pid not in roles and series.gone is None:
                series.gone = now
        redis = self.redis_pid()
        if redis is not None:
            values = read_process(redis)
            if values is not None:
                self.redis_samples.append((now, values[0]))

    def scrape_now(self) -> None:
        self._scrape()

    def _scrape(self) -> None:
        now = time.monotonic()
        try:
            samples, counts = scrape(self.metrics_port)
        except (OSError, ValueError) as exc:
            self.scrape_errors.append(f"{type(exc).__name__}: {exc}")
            return
        for worker, count in counts.items():
            self.series_counts.setdefault(worker, []).append((now, count))
        for key, value in samples.items():
            self.metrics.setdefault(key, []).append((now, value))

    def metric_increase(
        self,
        name: str,
        since: float = 0.0,
        skip: Callable[[float, float], bool] | None = None,
        **labels: str,
    ) -> float:
        """The increase of every series of `name` whose labels include `labels`."""
        return sum(
            increase(series, since, skip)
            for (n, lab), series in self.metrics.items()
            if n == name and all(dict(lab).get(k) == v for k, v in labels.items())
        )
