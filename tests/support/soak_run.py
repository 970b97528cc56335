"""The soak itself (benchmarks/soak.py runs it by hand, tests/integration/reliability/
test_soak.py for three minutes): `inferd serve --workers 2` on a copy of the example models
(tests/support/soak_repository.py) in poll mode, with a response cache in a Redis of the
soak's own (a `redis-server` on a free port, so that it can be killed and restarted), under
every kind of traffic and fault at once, as planned by tests/support/soak_plan.py:

- steady valid traffic (`clients` threads, `rate` requests a second in all) on every example
  model over HTTP and gRPC, unary, streams and the ensemble, each answer checked against the
  model (tests/support/soak_references.py) and its version against the versions that may
  answer then;
- a stream of invalid and hostile requests, and slow clients (tests/support/soak_hostile.py);
- a hot swap every minute, a canary of mlp promoted and rolled back, bursts of `burst_factor`
  times the steady clients sending back to back (tests/support/soak_burst.py, a process of
  its own), Redis killed and restarted, a worker killed with SIGKILL;
- readiness, every server process's memory, descriptors and threads, and /metrics watched
  throughout (tests/support/soak_watch.py).

Every wait has a bound; every process it starts is ended, even when it fails (the server by
SIGTERM, then SIGKILL to every process of its family and their process groups). The
result is a dict (`run`); tests/support/soak_report.py judges and prints it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.server_process import free_port, listeners_of, wait_until_serving
from tests.support.soak_hostile import MAX_REQUEST_MIB, SLOW_KINDS, Target, kinds, slow_client
from tests.support.soak_plan import (
    BURST,
    MAIN_THREAD_STEPS,
    REDIS_KILL,
    WORKER_KILL,
    Step,
    VersionBook,
    Window,
    Windows,
    plan,
)
from tests.support.soak_processes import (
    SoakRedis,
    die_with_the_soak,
    family,
    is_group_leader,
    start_time,
    workers_of,
)
from tests.support.soak_references import Cases, References
from tests.support.soak_report import (
    Bounds,
    Tally,
    finding_of,
    judge_processes,
    judge_readiness,
    judge_series,
    process_report,
    summary,
)
from tests.support.soak_repository import (
    add_mlp_canary,
    remove_mlp_canary,
    set_mlp_weights,
    swap_linear,
    swap_text_stats,
    write_repository,
)
from tests.support.soak_requests import CALL_TIMEOUT_S, MODES, Caller
from tests.support.soak_watch import Watch, increase

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
POLL_S = 2.0
START_TIMEOUT_S = 300.0
RESTART_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 60.0
HOSTILE_EVERY_S = 0.25
HEAVY_EVERY = 20  # one heavy (megabytes) hostile request per this many
# What the server executes at once on mlp: a batch of its max_batch_size in each worker.
# A burst sends burst_factor times as many requests at once (its queue holds 32 more).
BURST_BASE = WORKERS * 32
CACHE_FAILING = 0.05  # of the Redis lookups while Redis is up: errors and skips beyond it fail
RECOVERY_S = 30.0  # after Redis is back, the cache must hit again within the rest of the run


@dataclass(frozen=True)
class Options:
    duration_s: float
    warmup_s: float
    rate: float = 30.0
    clients: int = 6
    burst_factor: int = 10  # burst clients per request mlp executes at once (BURST_BASE)
    seed: int = 34
    grace_s: float = 25.0
    bounds: Bounds = Bounds(rss_mib_h=32.0, fds_h=64.0, threads_h=8.0)
    cache_timeout_ms: int | None = None  # None: the server's default
    work_dir: Path | None = None  # kept; default a temporary folder, removed on success


@dataclass
class Soak:
    options: Options
    work: Path
    windows: Windows = field(default_factory=Windows)
    stop: threading.Event = field(default_factory=threading.Event)
    events: list[dict[str, Any]] = field(default_factory=list)
    bursts: list[dict[str, Any]] = field(default_factory=list)
    redis_restarts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.repo = self.work / "repo"
        self.book = VersionBook(self.options.grace_s)
        self.started = time.monotonic()
        self.tally = Tally(self.windows, self.book, self.started)
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.redis = SoakRedis()
        self.redis_window: Window | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.linear_version = self.text_version = 1
        self.seen: dict[int, int | None] = {}  # pid -> its start time, every process seen
        self.watch: Watch | None = None
        self.burst: subprocess.Popen[bytes] | None = None

    def event(self, what: str) -> None:
        self.events.append({"t": round(time.monotonic() - self.started, 1), "what": what})

    # -- the server ------------------------------------------------------------------------------

    def start_server(self) -> None:
        cache = f"redis,host=127.0.0.1,port={self.redis.port}"
        if self.options.cache_timeout_ms is not None:
            cache += f",timeout_ms={self.options.cache_timeout_ms}"
        command = [
            sys.executable, "-m", "inferd", "serve", "--model-repository", str(self.repo),
            "--workers", str(WORKERS), "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
            "--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S),
            "--cache-config", cache, "--max-request-mib", str(MAX_REQUEST_MIB),
            "--exit-timeout-secs", "10",
        ]  # fmt: skip
        log = (self.work / "server.log").open("ab")
        # Its own session: its process group is ours to kill, whatever happens to us.
        self.server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_the_soak,
        )  # fmt: skip
        log.close()
        wait_until_serving(
            self.server.pid, self.http_port, exit_code=self.server.poll,
            output=lambda: self.log_tail(40), timeout_s=START_TIMEOUT_S, listeners=WORKERS,
        )  # fmt: skip

    def log_tail(self, lines: int) -> str:
        path = self.work / "server.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_server(self) -> int | None:
        """SIGTERM, the graceful stop; its exit status (None: it had to be killed)."""
        assert self.server is not None
        self.remember_family()
        if self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
        try:
            return self.server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None

    def remember_family(self) -> None:
        """Every process of the server's family, seen now or by the watch, by pid and start."""
        for series in self.watch.processes.values() if self.watch else []:
            self.seen.setdefault(series.pid, series.started)
        if self.server is not None and self.server.poll() is None:
            for pid in family(self.server.pid):
                self.seen.setdefault(pid, start_time(pid))

    def kill_everything(self) -> None:
        """Every process the soak started, by id: the server's family as seen during the run
        (the workers lead process groups of their own), each only while it is still the
        process that was seen (same start time: a pid may be reused by then); then the
        server's own group, a burst still running, and Redis."""
        if self.server is not None:
            self.remember_family()
            for pid, started in sorted(self.seen.items()):
                if started is None or start_time(pid) != started:
                    continue  # gone, or the pid is someone else's now
                if is_group_leader(pid) and pid != self.server.pid:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if self.server.returncode is None:  # not reaped: its group id is still ours
                with contextlib.suppress(OSError):
                    os.killpg(self.server.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(timeout=30)
        if self.burst is not None and self.burst.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.burst.pid, signal.SIGKILL)  # not reaped: its group is ours
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.burst.wait(timeout=30)
        self.redis.kill()

    # -- traffic -------------------------------------------------------------------------------

    def steady_client(self, n: int, cases: Cases) -> None:
        rng = random.Random(self.options.seed * 1000 + n)
        table = [(model, mode) for model, modes in MODES.items() for mode in modes]
        caller = Caller(self.http_port, self.grpc_port)
        interval = self.options.clients / self.options.rate
        next_at = time.monotonic() + rng.random() * interval
        order: list[tuple[str, str]] = []
        try:
            while not self.stop.is_set():
                self.stop.wait(max(0.0, next_at - time.monotonic()))
                if self.stop.is_set():
                    break
                next_at = max(next_at + interval, time.monotonic() - interval)
                if not order:
                    order = rng.sample(table, len(table))
                model, mode = order.pop()
                case = cases.make(model)
                sent = time.monotonic()
                answer = caller.send(case, mode)
                answered = time.monotonic()
                wrong = None
                if answer.outputs is not None:
                    wrong = cases.check(case, answer.version, answer.outputs)
                self.tally.answer(model, mode, answer, wrong, sent, answered)
        finally:
            caller.close()

    def hostile_client(self) -> None:
        table = kinds()
        light = [k for k in table if not k.heavy]
        heavy = [k for k in table if k.heavy]
        target = Target(self.http_port, self.grpc_port)
        n = 0
        while not self.stop.wait(HOSTILE_EVERY_S):
            n += 1
            kind = (
                heavy[(n // HEAVY_EVERY) % len(heavy)]
                if n % HEAVY_EVERY == 0
                else light[n % len(light)]
            )
            sent = time.monotonic()
            try:
                got = kind.send(target)
            except OSError as exc:  # connection refused or reset before any answer
                got = "no_answer" if isinstance(exc, TimeoutError) else "lost"
            self.tally.hostile_answer(kind.name, got, kind.expected, sent)

    def slow_clients(self, kind_index: int) -> None:
        kind = SLOW_KINDS[kind_index]
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                outcome, held = slow_client(self.http_port, kind, self.stop.is_set)
            except OSError:
                self.stop.wait(1.0)  # refused: a worker restarting; try again
                continue
            if outcome != "stopped":
                if outcome == "kept" and WORKER_KILL in self.windows.covering(
                    started, time.monotonic()
                ):
                    outcome = "kept_during_kill"  # the killed worker's connection
                self.tally.slow_client(kind.name, outcome, held, started)

    # -- the plan's steps --------------------------------------------------------------------------

    def run_step(self, step: Step) -> None:
        try:
            getattr(self, f"step_{step.action}")(step)
        except Exception as exc:  # a step the soak could not take: a finding, not a traceback
            self.tally.find("soak_step_failed", f"{step.action}: {type(exc).__name__}: {exc}")

    def step_swap_linear(self, step: Step) -> None:
        self.linear_version += 1
        v = self.linear_version
        self.book.set("linear_noconfig", {str(v)})
        swap_linear(self.repo, v)
        self.event(f"hot swap: linear_noconfig version {v} (new weights) written")

    def step_swap_text_stats(self, step: Step) -> None:
        self.text_version += 1
        v = self.text_version
        self.book.set("text_stats", {str(v)})
        swap_text_stats(self.repo, v)
        self.event(f"hot swap: text_stats version {v} (a Python model loaded again) written")

    def step_canary(self, step: Step) -> None:
        self.book.set("mlp", {"1", "2"})
        set_mlp_weights(self.repo, {"1": 90, "2": 10})
        add_mlp_canary(self.repo)
        self.event("canary: mlp version 2 written with canary_weights {1: 90, 2: 10}")

    def step_promote(self, step: Step) -> None:
        self.book.set("mlp", {"2"})
        set_mlp_weights(self.repo, {"1": 0, "2": 100})
        self.event("canary promoted: mlp canary_weights {1: 0, 2: 100}")

    def step_rollback(self, step: Step) -> None:
        self.book.set("mlp", {"1"})
        set_mlp_weights(self.repo, {"1": 100, "2": 0})
        self.event("canary rolled back: mlp canary_weights {1: 100, 2: 0}")

    def step_retire(self, step: Step) -> None:
        remove_mlp_canary(self.repo)
        self.event("canary retired: mlp version 2 removed")

    def step_burst(self, step: Step) -> None:
        clients = self.options.burst_factor * BURST_BASE
        window = self.windows.open(BURST)
        self.event(f"burst: {clients} clients back to back on mlp for {step.length_s:.0f} s")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
        command = [
            sys.executable, "-m", "tests.support.soak_burst", "--port", str(self.http_port),
            "--clients", str(clients), "--seconds", str(step.length_s), "--repo", str(self.repo),
            "--seed", str(self.options.seed),
        ]  # fmt: skip
        began = time.monotonic()
        # Its step's thread waits for it: the parent-death signal ends it with the soak.
        proc = self.burst = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            start_new_session=True, preexec_fn=die_with_the_soak,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=step.length_s + 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
        finally:
            self.windows.close(window)
        took = time.monotonic() - began
        if proc.returncode != 0:
            self.tally.find("burst_failed", f"exit {proc.returncode}: {err.decode()[-600:]}", began)
            return
        result = json.loads(out)
        self.judge_burst(result, took, clients)

    def judge_burst(self, result: dict[str, Any], took: float, clients: int) -> None:
        statuses: dict[str, int] = result["statuses"]
        answers = result["answers"]
        total = sum(statuses.values())
        for sent, answered, version in answers:
            if not self.book.allowed("mlp", version, sent, answered):
                self.tally.find("stale_version", f"mlp burst: version {version}", sent)
            self.tally.seen_version("mlp", version)
        for i in range(result["wrong_count"]):
            detail = result["wrong"][i] if i < len(result["wrong"]) else "(not kept)"
            self.tally.find("wrong_answer", f"mlp burst: {detail}")
        for sent, when, what in result["lost"]:
            if WORKER_KILL not in self.windows.covering(sent, when):
                self.tally.find("connection_lost_outside_kill", f"mlp burst: {what}", sent)
        for status, n in statuses.items():
            if status not in ("200", "429", "503", "lost"):
                for _ in range(n):
                    self.tally.find(finding_of(status), f"mlp burst: {status}")
        summary_row = {
            "clients": clients, "seconds": round(took, 1), "answers": total,
            "per_s": round(total / took, 1), "statuses": statuses,
            "refusal_ms_p50_p99": [round(v, 1) for v in result["refusal_ms"]],
        }  # fmt: skip
        self.bursts.append(summary_row)
        self.event(f"burst over: {total} answers in {took:.0f} s, {statuses}")

    def step_kill_redis(self, step: Step) -> None:
        self.redis_window = self.windows.open(REDIS_KILL)
        self.redis.kill()
        self.event(f"Redis killed (SIGKILL); down for {step.length_s:.0f} s")

    def step_restart_redis(self, step: Step) -> None:
        """On the soak's main thread (its child dies with the soak, not with a step)."""
        try:
            self.redis.start()
        except RuntimeError as exc:
            self.tally.find("redis_restart_failed", str(exc))
            return
        finally:
            if self.redis_window is not None:
                self.windows.close(self.redis_window)
        self.redis_restarts.append(time.monotonic())
        self.event(f"Redis restarted on port {self.redis.port} (empty)")

    def step_kill_worker(self, step: Step) -> None:
        assert self.server is not None
        workers = workers_of(self.server.pid)
        if not workers:
            self.tally.find("worker_not_found", "no worker process to kill")
            return
        victim = random.Random(self.options.seed).choice(sorted(workers))
        before = listeners_of(self.server.pid, self.http_port) or WORKERS
        window = self.windows.open(WORKER_KILL)
        began = time.monotonic()
        try:
            os.kill(victim, signal.SIGKILL)
            self.event(f"worker pid {victim} killed (SIGKILL)")
            deadline = began + RESTART_TIMEOUT_S
            while time.monotonic() < deadline and not self.stop.is_set():
                now_workers = set(workers_of(self.server.pid))
                back = victim not in now_workers and len(now_workers) == WORKERS
                if back and (listeners_of(self.server.pid, self.http_port) or 0) >= before:
                    new = sorted(now_workers - set(workers))
                    self.event(f"worker restarted: pid {new} listening "
                                   f"{time.monotonic() - began:.1f} s after the kill")  # fmt: skip
                    return
                self.stop.wait(0.2)
            if not self.stop.is_set():
                self.tally.find("worker_not_restarted",
                                f"no new worker listening {RESTART_TIMEOUT_S:.0f} s after the kill",
                                began)  # fmt: skip
        finally:
            self.windows.close(window)

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        o = self.options
        write_repository(self.repo)
        refs = References(self.repo)
        cases = Cases(refs, o.seed)
        self.redis.start()
        self.start_server()
        assert self.server is not None
        self.started = self.tally.started = time.monotonic()
        self.event(f"server serving: pid {self.server.pid}, workers {workers_of(self.server.pid)}")
        watch = self.watch = Watch(
            self.server.pid, self.http_port, self.grpc_port, self.metrics_port,
            models=sorted(MODES), probe_every_s=0.5,
            sample_every_s=min(5.0, max(1.0, o.duration_s / 120)), scrape_every_s=10.0,
            stop=self.stop, redis_pid=lambda: self.redis.pid,
        )  # fmt: skip
        threads = [threading.Thread(target=self.steady_client, args=(n, cases), daemon=True)
                   for n in range(o.clients)]  # fmt: skip
        threads.append(threading.Thread(target=self.hostile_client, daemon=True))
        threads += [threading.Thread(target=self.slow_clients, args=(i,), daemon=True)
                    for i in range(len(SLOW_KINDS))]  # fmt: skip
        threads += watch.threads()
        for t in threads:
            t.start()
        steps: list[threading.Thread] = []
        for step in plan(o.duration_s):
            if self.stop.wait(max(0.0, self.started + step.at_s - time.monotonic())):
                break
            if self.server.poll() is not None:
                self.tally.find(
                    "server_exited", f"status {self.server.returncode}: {self.log_tail(20)}"
                )
                break
            if step.action in MAIN_THREAD_STEPS:
                self.run_step(step)
                continue
            thread = threading.Thread(target=self.run_step, args=(step,), daemon=True)
            thread.start()
            steps.append(thread)
        self.stop.wait(max(0.0, self.started + o.duration_s - time.monotonic()))
        ended = time.monotonic()
        watch.sample_now()
        watch.scrape_now()
        self.stop.set()
        for t in [*threads, *steps]:
            t.join(timeout=CALL_TIMEOUT_S + 30)
        stuck = [t.name for t in [*threads, *steps] if t.is_alive()]
        if stuck:
            self.tally.find("soak_thread_stuck", f"threads still running: {stuck}")
        exit_status = self.stop_server()
        return self.result(watch, ended, exit_status)

    # -- the result --------------------------------------------------------------------------

    def result(self, watch: Watch, ended: float, exit_status: int | None) -> dict[str, Any]:
        """Every criterion applied (the findings), and the figures the summary prints."""
        o, tally = self.options, self.tally
        measured_from = self.started + o.warmup_s
        by_start = sorted(watch.processes.values(), key=lambda s: s.first_seen)
        rows = [process_report(s, measured_from, ended, o.warmup_s, o.bounds) for s in by_start]
        judge_processes(tally, rows, o.bounds, ended)
        series = judge_series(
            tally, watch.series_counts, measured_from, ended, o.warmup_s, o.bounds
        )
        readiness = judge_readiness(tally, watch.probes)
        self.judge_versions(ended)
        cache = self.judge_cache(watch, ended)
        if exit_status != 0:
            how = "was killed" if exit_status is None else f"exited with {exit_status}"
            tally.find("server_exit", f"inferd serve {how} on SIGTERM: {self.log_tail(15)}")
        for model, modes in MODES.items():
            for mode in modes:
                if not tally.requests[(model, mode, "ok")]:
                    tally.find("never_answered", f"{model} {mode}: no right answer in the run")
        reasons: Counter[str] = Counter()
        for (name, labels), points in watch.metrics.items():
            if name == "inferd_request_failure_total":
                reasons[dict(labels).get("reason", "")] += int(increase(points))
        redis = [
            round(kib / 1024, 1) for _, kib in watch.redis_samples[:1] + watch.redis_samples[-1:]
        ]
        b = o.bounds
        return {
            "passed": not tally.findings,
            "duration_s": o.duration_s,
            "warmup_s": o.warmup_s,
            "seed": o.seed,
            "rate": o.rate,
            "clients": o.clients,
            "requests": {"|".join(k): n for k, n in sorted(tally.requests.items())},
            "valid_total": sum(tally.requests.values()),
            "valid_ok": sum(n for (_, _, out), n in tally.requests.items() if out == "ok"),
            "refused": {"|".join(k): n for k, n in sorted(tally.refused.items())},
            "versions": {f"{m} v{v}": n for (m, v), n in sorted(tally.versions.items())},
            "events": self.events,
            "bursts": self.bursts,
            "windows": [self.window_row(w) for w in self.windows.all()],
            "hostile": {"|".join(k): n for k, n in sorted(tally.hostile.items())},
            "slow": {"|".join(k): n for k, n in sorted(tally.slow.items())},
            "slow_held_s": {k: round(v, 1) for k, v in tally.slow_held_s.items()},
            "readiness": readiness,
            "metrics": {
                "failures_by_reason": dict(reasons),
                "worker_restarts": int(watch.metric_increase("inferd_worker_restarts_total")),
                "cache": cache,
                "exported_samples": series,
                "scrape_errors": len(watch.scrape_errors),
            },
            "processes": rows,
            "redis_rss_mib_first_last": redis,
            "bounds": {
                "rss_mib_per_h": b.rss_mib_h,
                "fds_per_h": b.fds_h,
                "threads_per_h": b.threads_h,
                "series_per_h": b.series_h,
            },  # fmt: skip
            "log_counts": self.log_counts(),
            "server_exit": exit_status,
            "findings": dict(tally.findings),
            "examples": dict(tally.examples),
        }

    def window_row(self, w: Window) -> dict[str, Any]:
        end = None if w.end is None else round(w.end - self.started, 1)
        return {"kind": w.kind, "from_s": round(w.start - self.started, 1), "to_s": end}

    def judge_versions(self, ended: float) -> None:
        """Every version a change deployed answered at least once (if the run lasted the
        grace past its change)."""
        for model, version, start, _ in self.book.deployed(ended):
            if ended - start < self.options.grace_s + 10:
                continue
            if not self.tally.versions[(model, version)]:
                self.tally.find("version_never_answered", f"{model} version {version}", start)

    def judge_cache(self, watch: Watch, ended: float) -> dict[str, Any]:
        """The shared cache kept sharing: hits at all, hits again after Redis came back,
        and, while Redis was up, Redis calls that failed or were skipped (its breaker open)
        within CACHE_FAILING of the lookups."""

        def redis(name: str, since: float = 0.0, while_up: bool = False) -> int:
            skip = self.redis_down if while_up else None
            return int(
                watch.metric_increase(f"inferd_cache_{name}_total", since, skip, tier="redis")
            )

        names = ("hits", "misses", "errors", "breaker_skips", "dropped_inserts", "inserts")
        out: dict[str, Any] = {f"redis_{name}": redis(name) for name in names}
        out["coalesced"] = int(watch.metric_increase("inferd_cache_coalesced_total"))
        up = {name: redis(name, while_up=True) for name in names}
        out["while_redis_up"] = up
        out["redis_hits_after_restarts"] = []
        if not out["redis_hits"]:
            self.tally.find("cache_never_hit", f"the shared cache never answered: {out}")
        lookups = up["hits"] + up["misses"]
        failing = up["errors"] + up["breaker_skips"]
        if failing > CACHE_FAILING * max(lookups, 1):
            self.tally.find(
                "cache_failing_while_redis_up",
                f"while Redis was up: {up['errors']} Redis errors and {up['breaker_skips']} "
                f"lookups skipped (breaker open) against {lookups} lookups "
                f"({up['hits']} hits); {up['dropped_inserts']} inserts dropped",
            )
        for restarted in self.redis_restarts:
            if ended - restarted < RECOVERY_S + 10:
                continue
            hits = redis("hits", since=restarted)
            out["redis_hits_after_restarts"].append(hits)
            if not hits:
                self.tally.find("cache_not_back", "no Redis hit after Redis restarted", restarted)
        return out

    def redis_down(self, start: float, end: float) -> bool:
        return REDIS_KILL in self.windows.covering(start, end)

    def log_counts(self) -> dict[str, Any]:
        path = self.work / "server.log"
        levels: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                m = re.match(r"\d\d:\d\d:\d\d (\w+)\s+(\S+): (.*)", line)
                if m:
                    levels[m[1]] += 1
                    if m[1] in ("ERROR", "CRITICAL"):
                        errors[re.sub(r"\d+", "N", m[3])[:160]] += 1
                elif line.startswith("Traceback"):
                    levels["Traceback"] += 1
        return {"levels": dict(levels), "errors": dict(errors.most_common(10))}


@contextlib.contextmanager
def work_dir(chosen: Path | None) -> Iterator[tuple[Path, Callable[[bool], None]]]:
    """The soak's folder: `chosen` (kept), or a temporary one removed when the run passed."""
    if chosen is not None:
        chosen.mkdir(parents=True, exist_ok=True)
        yield chosen, lambda passed: None
        return
    path = Path(tempfile.mkdtemp(prefix="inferd-soak-"))
    keep = [True]
    try:
        yield path, lambda passed: keep.__setitem__(0, not passed)
    finally:
        if not keep[0]:
            shutil.rmtree(path, ignore_errors=True)


def run(options: Options) -> dict[str, Any]:
    """One soak; its result (see soak_report for `passed` and the findings)."""
    with work_dir(options.work_dir) as (work, passed):
        soak = Soak(options, work)
        try:
            result = soak.run()
        finally:
            soak.kill_everything()
        result["work_dir"] = str(work)
        passed(bool(result["passed"]))
        if not result["passed"]:
            result["server_log"] = str(work / "server.log")
        return result


__all__ = ["Options", "run", "summary"]
