"""`inferd serve --workers N`: N whole servers on one set of ports, and a supervisor.

One inferd process is bound by one Python thread: at 64 connections on small requests it
runs one core flat while the machine has more (docs/benchmarks.md). N worker processes,
each loading the repository and serving HTTP and gRPC on the same ports (SO_REUSEPORT:
the kernel spreads connections across them), lift that bound. The supervisor starts them,
restarts one that dies, stops them all gracefully on SIGTERM/SIGINT (exit 0 when they all
drained), and serves the one /metrics endpoint, collected from every worker.

What stays per worker, by design: models and their memory (N copies), batches (each worker
batches its own connections' requests), and control: the repository API and routing
changes would reach one worker only, so `--workers` refuses explicit model control and
`--admin-api on`; poll mode works (each worker polls the repository).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferd import log as inferd_log
from inferd.limits import ensure_file_descriptors
from inferd.metrics.host_families import GpuCollector, register_host_metrics
from inferd.metrics.metrics_endpoint import MetricsServer
from inferd.server.shutdown import EXIT_MARGIN_S
from inferd.settings import Settings
from inferd.telemetry.trace_config import TRITON
from inferd.workers import peers
from inferd.workers.peers import WorkerSlot

log = logging.getLogger("inferd.workers")

RESTART_BACKOFF_MAX_S = 30.0
GIVE_UP_AFTER = 5  # every worker died this many times in a row, each soon after its start
STABLE_AFTER_S = 30.0  # a worker that ran this long resets the restart backoff


class WorkersError(Exception):
    """Settings that `--workers` cannot honour; the CLI prints it and exits 2."""


def check(settings: Settings) -> None:
    if settings.model_control_mode == "explicit" or settings.admin_api:
        raise WorkersError(
            "--workers > 1 runs independent processes: the repository API and routing changes "
            "would reach one of them only. Add --engine (N front ends of one engine, which "
            "carries both), or use --model-control-mode none or poll without --admin-api on"
        )
    if settings.http_port == 0 or settings.grpc_port == 0 or settings.metrics_port == 0:
        raise WorkersError("--workers > 1 needs fixed ports (0, any free port, differs per worker)")
    if settings.trace.mode == TRITON and settings.trace.file:
        raise WorkersError(
            f"--trace-config triton,file={settings.trace.file} with --workers > 1: each of the "
            "independent processes would write that file over the others'. Add --engine (the "
            "engine writes it), or trace with --trace-otlp-endpoint URL"
        )


@dataclass
class _Worker:
    slot: WorkerSlot
    process: multiprocessing.process.BaseProcess
    started: float
    restarts: int = 0
    failures: int = 0  # deaths in a row, each within STABLE_AFTER_S of its start
    backoff_s: float = 0.0
    died_at: float | None = None  # seen dead, not restarted yet


def _worker_main(settings: Settings, slot: WorkerSlot, supervisor_pid: int) -> None:
    """A worker's entry point (a spawned interpreter, started with SIGINT ignored)."""
    _die_with_parent()
    if os.getppid() != supervisor_pid:
        return  # the supervisor died before the parent-death signal was armed
    # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which then
    # stops the workers once, gracefully (a second signal would make uvicorn force-quit).
    os.setpgid(0, 0)
    from inferd.workers.worker_role import run_worker

    inferd_log.configure(settings.log_level, settings.log_format, worker=slot.index)
    run_worker(settings, slot)


def _die_with_parent() -> None:
    """Linux: SIGTERM this worker if the supervisor dies (even by SIGKILL), so no orphan
    keeps serving the port. Elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class _WorkersCollector(Collector):
    """Every worker's metrics, asked at scrape time, with a `worker` label; and the
    supervisor's own: workers alive and restarts."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        workers = list(self.supervisor.workers)
        # In parallel: one stuck worker costs a scrape ASK_TIMEOUT_S, not N times that.
        with ThreadPoolExecutor(max_workers=len(workers)) as pool:
            answers = pool.map(
                lambda w: peers.ask_blocking(w.slot.socket_path(w.slot.index), {"op": "metrics"}),
                workers,
            )
            per_worker = {
                w.slot.index: a["families"]
                for w, a in zip(workers, answers, strict=True)
                if a is not None and "families" in a
            }
        yield from peers.merge_families(per_worker)
        yield GaugeMetricFamily(
            "inferd_workers",
            "Worker processes configured (--workers)",
            len(self.supervisor.workers),
        )
        yield GaugeMetricFamily(
            "inferd_workers_alive", "Worker processes answering (their metrics are here)",
            len(per_worker),
        )  # fmt: skip
        restarts = CounterMetricFamily(
            "inferd_worker_restarts", "Worker processes restarted after dying", labels=["worker"]
        )
        for w in self.supervisor.workers:
            restarts.add_metric([str(w.slot.index)], w.restarts)
        yield restarts


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.context: SpawnContext | ForkContext = multiprocessing.get_context("spawn")
        self.directory = Path(tempfile.mkdtemp(prefix="inferd-workers-"))  # 0700
        self.workers: list[_Worker] = []
        self.stopping = False

    def _slots(self) -> list[WorkerSlot]:
        n = self.settings.workers
        return [WorkerSlot(i, n, self.directory) for i in range(n)]

    def _process(self, slot: WorkerSlot) -> multiprocessing.process.BaseProcess:
        return self.context.Process(
            target=_worker_main,
            args=(self.settings, slot, os.getpid()),
            name=f"inferd-worker-{slot.index}",
        )

    def _start(self, slot: WorkerSlot) -> multiprocessing.process.BaseProcess:
        process = self._process(slot)
        # The worker starts with SIGINT ignored (an ignored signal stays ignored across
        # fork and exec, and Python keeps it so) until uvicorn installs its handlers: a
        # terminal's Ctrl-C, which reaches the whole process group, is the supervisor's to
        # act on. (A signal mask would not do: the spawn clears it in the child.)
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, handler)
        log.info("worker %d started (pid %s)", slot.index, process.pid)
        return process

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("signal %d: stopping %d workers", sig, len(self.workers))
        self.stopping = True

    def run(self) -> int:
        n = self.settings.workers
        metrics: MetricsServer | None = None
        gpus: GpuCollector | None = None
        try:
            if self.settings.metrics_port is not None:
                # Before the workers: a port in use fails here, with no worker to stop.
                registry = CollectorRegistry(auto_describe=False)
                registry.register(_WorkersCollector(self))
                if self.settings.metrics_triton_names:  # the host once, not once per worker
                    gpus = register_host_metrics(registry)
                metrics = MetricsServer(
                    registry, self.settings.host, self.settings.metrics_port, self.settings.limits
                )
                log.info(
                    "metrics of %d workers at http://%s:%d/metrics",
                    n,
                    self.settings.host,
                    self.settings.metrics_port,
                )
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
            for slot in self._slots():
                self.workers.append(_Worker(slot, self._start(slot), time.monotonic()))
            while not self.stopping:
                self._watch()
                if all(w.failures >= GIVE_UP_AFTER for w in self.workers):
                    log.error("every worker keeps dying at start; giving up (see above)")
                    self.stopping = True
                    self._stop_all()
                    return 1
            return self._stop_all()
        finally:
            if metrics is not None:
                metrics.close()
            if gpus is not None:
                gpus.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _watch(self) -> None:
        """Wait a moment for a worker to exit; restart the ones that died (with a growing
        pause when one keeps dying, e.g. on a model that crashes at load). Waits on the live
        workers only: a dead one's sentinel stays ready and would make this loop spin."""
        now = time.monotonic()
        due = [w.started + w.backoff_s for w in self.workers if w.died_at is not None]
        timeout = max(0.0, min([0.5, *(d - now for d in due)]))
        live = [w.process.sentinel for w in self.workers if w.died_at is None]
        if live:
            multiprocessing.connection.wait(live, timeout=timeout)
        else:
            time.sleep(timeout)
        now = time.monotonic()
        for w in self.workers:
            if self.stopping:
                return
            if w.died_at is None:
                if w.process.is_alive():
                    continue
                w.died_at = now
                if now - w.started >= STABLE_AFTER_S:  # it had run fine: start afresh
                    w.backoff_s, w.failures = 0.0, 0
                w.failures += 1
                pause = max(0.0, w.started + w.backoff_s - now)
                log.error(
                    "worker %d (pid %s) %s; restarting it%s",
                    w.slot.index,
                    w.process.pid,
                    how_it_ended(w.process.exitcode),
                    f" in {pause:.0f} s" if pause >= 1 else "",
                )
            if now < w.started + w.backoff_s:
                continue  # still pausing before the restart
            w.process.close()
            w.process = self._start(w.slot)
            w.started, w.died_at = now, None
            w.restarts += 1
            w.backoff_s = min(RESTART_BACKOFF_MAX_S, max(1.0, w.backoff_s * 2))

    def _stop_all(self) -> int:
        return self._stop(self.workers)

    def _stop(self, workers: list[_Worker]) -> int:
        for w in workers:
            if w.process.is_alive() and w.process.pid is not None:
                os.kill(w.process.pid, signal.SIGTERM)
        # A worker's drain (HTTP, gRPC, models) shares one exit_timeout_s, and its watchdog
        # ends it EXIT_MARGIN_S later at the latest (server/shutdown.py): past that it is hung.
        deadline = time.monotonic() + self.settings.exit_timeout_s + 2 * EXIT_MARGIN_S
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                log.warning("worker %d did not stop in time; killing it", w.slot.index)
                w.process.kill()
                w.process.join(5)
        codes = [w.process.exitcode for w in workers]
        log.info("all workers stopped (exit codes %s)", codes)
        for w in workers:
            if w.process.exitcode not in (0, -signal.SIGTERM):
                log.warning("worker %d %s", w.slot.index, how_it_ended(w.process.exitcode))
        # -SIGTERM: a worker still starting (no handlers yet, nothing served) that our
        # SIGTERM ended; a serving worker drains and exits 0.
        return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1


def how_it_ended(exitcode: int | None) -> str:
    """multiprocessing's exit code in words: -N is 'killed by SIGNAME', not 'exited with -N'."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}"
    return f"exited with code {exitcode}"


def run(settings: Settings) -> None:
    ensure_file_descriptors(settings.limits)
    check(settings)
    code = Supervisor(settings).run()
    if code:
        raise SystemExit(code)
