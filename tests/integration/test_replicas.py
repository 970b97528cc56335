"""Replicas that lose nothing: three `inferd serve` processes behind nginx, run with the
shipped deploy/nginx/inferd.conf (its upstreams and ports pointed at loopback), under
continuous HTTP load. One replica is killed with SIGKILL, another drained with SIGTERM and
restarted; the client sees no failed request and every answer is right. The replicas
share the Redis response cache (the real Redis at 127.0.0.1:6379, a database of this test's
own), so hits go on across replicas: the load repeats its inputs, and an answer one replica
computed is a hit on another that never executed it.

Needs nginx (Debian's package; scripts/install-test-tools.sh installs it): skipped, saying
why, where it is missing; failed instead where CI requires the test tools. Needs the Redis
every machine of this project runs at 127.0.0.1:6379 (as the cache tests do): failed,
saying so, where it does not answer.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from inferd.cache.redis_tier import KEY_PREFIX
from tests.models import write_counter
from tests.server_process import check_port_free, free_port, status_of, wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "inferd.conf"
MODEL = "counter"
CLIENTS = 4
DEADLINE_S = 60.0  # for each phase; the whole load stops by itself past 4 of them
MAX_REQUESTS = 50_000  # the load's bound in count
REDIS_DB = 13  # this test's own database of the shared Redis (the cache tests use 11)
CACHE_CONFIG = f"redis,host=127.0.0.1,port=6379,db={REDIS_DB},ttl=600,timeout_ms=200"


def nginx_binary() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )
    if found is None:
        reason = (
            "`nginx` is not installed: scripts/install-test-tools.sh installs it (Debian's "
            "nginx package, with apt-get; `make test` runs it first)"
        )
        if os.environ.get("INFERD_REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


@dataclass
class Replica:
    repository: Path
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        check_port_free(self.port)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "inferd", "serve", "--model-repository",
                    str(self.repository), "--http-port", str(self.port), "--grpc-port", "0",
                    "--metrics-port", "0", "--exit-timeout-secs", "20",
                    "--cache-config", CACHE_CONFIG,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until_serving(
            self.proc.pid, self.port, exit_code=self.proc.poll, output=self.output, timeout_s=60
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stats(self) -> dict[str, Any]:
        r = httpx.get(f"http://127.0.0.1:{self.port}/v2/models/{MODEL}/stats", timeout=10)
        r.raise_for_status()
        return dict(r.json()["model_stats"][0])

    def successes(self) -> int:
        """Requests this replica answered successfully (Triton's statistics)."""
        return int(self.stats()["inference_stats"]["success"]["count"])

    def cache_hits(self) -> int:
        return int(self.stats()["inference_stats"]["cache_hit"]["count"])

    def infer(self, value: float) -> None:
        r = httpx.post(
            f"http://127.0.0.1:{self.port}/v2/models/{MODEL}/infer", json=_body(value), timeout=30
        )
        r.raise_for_status()
        assert r.json()["outputs"][0]["data"] == [value]

    def stop(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


def render_nginx(prefix: Path, listen: int, replicas: list[Replica]) -> Path:
    """nginx.conf around the shipped file: its upstream servers and ports on loopback."""
    shipped = NGINX_CONF.read_text(encoding="utf-8")
    http_servers = "".join(
        f"    server 127.0.0.1:{r.port} max_fails=1 fail_timeout=5s;\n" for r in replicas
    )
    site, count = re.subn(
        r"(upstream inferd_http \{\n)(?:.*\n)*?(    keepalive)",
        lambda m: m[1] + http_servers + m[2],
        shipped,
    )
    assert count == 1, "deploy/nginx/inferd.conf has no upstream inferd_http block"
    # gRPC is not under test here: its server block goes, with its upstream.
    site = re.sub(r"upstream inferd_grpc \{\n(?:.*\n)*?\}\n", "", site)
    site = re.sub(r"server \{\n    listen 8001 http2;(?:.*\n)*?\}\n", "", site)
    site, count = re.subn(r"listen 8000;", f"listen 127.0.0.1:{listen};", site)
    assert count == 1
    (prefix / "site.conf").write_text(site)
    temp = prefix / "temp"
    temp.mkdir(mode=0o777)
    temp.chmod(0o777)  # nginx's workers may run as another user (nobody) when we are root
    conf = prefix / "nginx.conf"
    conf.write_text(
        f"daemon off;\nworker_processes 1;\npid {prefix}/nginx.pid;\n"
        f"error_log {prefix}/error.log info;\n"
        "events { worker_connections 1024; }\n"
        "http {\n"
        f"  access_log {prefix}/access.log;\n"
        + "".join(
            f"  {kind}_temp_path {temp}/{kind};\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        + f"  include {prefix}/site.conf;\n}}\n"
    )
    return conf


@dataclass
class Load:
    """CLIENTS threads sending requests through the balancer until stopped (or bounded)."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    answered: set[float] = field(default_factory=set)  # the distinct inputs answered
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        give_up = time.monotonic() + 5 * DEADLINE_S
        for n in range(CLIENTS):
            thread = threading.Thread(target=self._client, args=(n, give_up), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _client(self, n: int, give_up: float) -> None:
        with httpx.Client(timeout=60) as client:
            i = 0
            while not self.stop.is_set() and time.monotonic() < give_up:
                if self.ok + len(self.failures) >= MAX_REQUESTS:
                    return
                value = float(n * 1000 + i % 50)  # repeated inputs: cache hits
                try:
                    r = client.post(f"{self.url}/v2/models/{MODEL}/infer", json=_body(value))
                    good = r.status_code == 200 and r.json()["outputs"][0]["data"] == [value]
                    failure = "" if good else f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if failure:
                        self.failures.append(failure)
                    else:
                        self.ok += 1
                        self.answered.add(value)
                i += 1

    def wait_for_more(self, count: int, what: str) -> None:
        """Wait until `count` more requests succeeded (the load goes on meanwhile)."""
        target = self.ok + count
        deadline = time.monotonic() + DEADLINE_S
        while self.ok < target:
            assert not self.failures, self.failures[:5]
            assert time.monotonic() < deadline, f"{what}: {self.ok}/{target} requests"
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S:.0f} s"
        time.sleep(0.05)


def _body(value: float) -> dict[str, Any]:
    return {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}


@pytest.fixture
def shared_cache() -> Iterator[redis.Redis]:
    """The replicas' Redis database, emptied of cache entries before and after."""
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"the replicas share the Redis at 127.0.0.1:6379, which is down: {exc}")

    def forget() -> None:
        for key in client.scan_iter(f"{KEY_PREFIX}*"):
            client.delete(key)

    forget()
    yield client
    forget()
    client.close()


@pytest.fixture
def cluster(tmp_path: Path, shared_cache: redis.Redis) -> Iterator[tuple[str, list[Replica]]]:
    nginx = nginx_binary()
    repo = tmp_path / "models"
    write_counter(repo, MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    replicas = [Replica(repo, free_port(), tmp_path / f"replica{i}.log") for i in range(3)]
    for replica in replicas:
        replica.start()
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    listen = free_port()
    conf = render_nginx(prefix, listen, replicas)
    check = subprocess.run(
        [nginx, "-t", "-p", str(prefix), "-c", str(conf)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    balancer = subprocess.Popen(
        [nginx, "-p", str(prefix), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{listen}"
    try:
        wait_until(lambda: status_of(f"{url}/v2/health/ready") == 200, "nginx serving")
        yield url, replicas
    finally:
        balancer.terminate()
        balancer.wait(timeout=30)
        for replica in replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                replica.proc.kill()
                replica.proc.wait(timeout=30)


def test_a_killed_and_a_drained_replica_lose_no_request(
    cluster: tuple[str, list[Replica]], shared_cache: redis.Redis
) -> None:
    url, (killed, drained, steady) = cluster
    load = Load(url)
    load.start()
    try:
        load.wait_for_more(300, "load through nginx")
        assert all(r.successes() > 0 for r in (killed, drained, steady))  # balanced over all

        assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
        load.wait_for_more(300, "load after a replica was killed")
        steady_hits = steady.cache_hits()

        # SIGTERM: the replica turns unready, refuses new requests with 503 (nginx retries
        # them elsewhere), finishes what it holds and exits 0.
        before = drained.successes()
        assert drained.stop(signal.SIGTERM) == 0, drained.output()
        assert before > 0
        load.wait_for_more(300, "load with one replica left")

        drained.start()  # on the same port: nginx brings it back after fail_timeout
        wait_until(lambda: drained.successes() > 0, "the restarted replica serving again")
        load.wait_for_more(300, "load after the restart")
    finally:
        load.finish()
    assert load.failures == [], f"{len(load.failures)} failed: {load.failures[:5]}"
    assert load.ok >= 1200
    # Hits went on through it all: the steady replica's grew after the kill, and the restarted
    # one (its counts start at zero) answered repeated inputs from the cache.
    assert steady.cache_hits() > steady_hits > 0
    assert drained.cache_hits() > 0

    # An answer one replica computed is a hit on another: `steady` executes a new input
    # (its entry reaches Redis in the background: wait for it, once every input of the load
    # has its one entry), then the restarted replica, which never saw that input, answers it
    # without executing.
    def entries() -> int:
        return len(list(shared_cache.scan_iter(f"{KEY_PREFIX}*")))

    wait_until(lambda: entries() == len(load.answered), "one entry per input of the load")
    value = 7_654_321.0
    steady.infer(value)
    wait_until(lambda: entries() == len(load.answered) + 1, "the new entry in Redis")
    hits, executions = drained.cache_hits(), drained.stats()["execution_count"]
    drained.infer(value)
    assert drained.cache_hits() == hits + 1
    assert drained.stats()["execution_count"] == executions  # it ran nothing
