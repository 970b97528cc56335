"""Replicas that lose nothing: three `inferd serve` processes behind nginx, run with the
shipped deploy/nginx/inferd.conf (its upstreams and ports pointed at loopback), under
continuous HTTP load. One replica is killed with SIGKILL, another drained with SIGTERM and
restarted; the client sees no failed request and every answer is right.

Needs nginx (Debian's package; scripts/install-test-tools.sh installs it): skipped, saying
why, where it is missing; failed instead where CI requires the test tools. Needs the Redis
every machine of this project runs at 127.0.0.1:6379: failed, saying so, where it is down.

The replicas share a response cache in the real Redis at 127.0.0.1:6379 (docs/cache.md; a
database of this test's own, only the cache's keys deleted): the load repeats its inputs,
so replicas answer some of it from entries others made, and a request answered by one
replica is a cache hit on another, which executes nothing for it.
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
import numpy as np
import pytest
import redis

from inferd.cache.redis_tier import KEY_PREFIX
from tests.support.models import write_counter
from tests.support.server_process import check_port_free, free_port, status_of, wait_until_serving

ROOT = Path(__file__).resolve().parents[3]
NGINX_CONF = ROOT / "deploy" / "nginx" / "inferd.conf"
MODEL = "counter"
CLIENTS = 4
DEADLINE_S = 60.0  # for each phase; the whole load stops by itself past 4 of them
MAX_REQUESTS = 50_000  # the load's bound in count
REDIS_DB = 13  # the shared cache's database (test_response_cache_redis.py uses 11)
CACHE = f"redis,host=127.0.0.1,port=6379,db={REDIS_DB}"  # the default bounds (issue 34)


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
                    "--metrics-port", "0", "--exit-timeout-secs", "20", "--cache-config", CACHE,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until_serving(
            self.proc.pid, self.port, exit_code=self.proc.poll, output=self.output, timeout_s=60
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def statistics(self) -> dict[str, Any]:
        """This replica's Triton statistics of the model."""
        r = httpx.get(f"http://127.0.0.1:{self.port}/v2/models/{MODEL}/stats", timeout=10)
        r.raise_for_status()
        entry: dict[str, Any] = r.json()["model_stats"][0]
        return entry

    def successes(self) -> int:
        """Requests this replica answered successfully (cache hits included)."""
        return int(self.statistics()["inference_stats"]["success"]["count"])

    def hits(self) -> int:
        return int(self.statistics()["inference_stats"]["cache_hit"]["count"])

    def ask(self, value: float) -> float:
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}
        r = httpx.post(f"http://127.0.0.1:{self.port}/v2/models/{MODEL}/infer", json=body)
        r.raise_for_status()
        return float(r.json()["outputs"][0]["data"][0])

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
                value = float(n * 1000 + i % 50)  # repeated inputs (see the module's note)
                body = {
                    "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [value]}]
                }
                try:
                    r = client.post(f"{self.url}/v2/models/{MODEL}/infer", json=body)
                    good = r.status_code == 200 and r.json()["outputs"][0]["data"] == [value]
                    failure = "" if good else f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if failure:
                        self.failures.append(failure)
                    else:
                        self.ok += 1
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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, list[Replica]]]:
    nginx = nginx_binary()
    repo = tmp_path / "models"
    write_counter(repo, MODEL)
    with (repo / MODEL / "config.pbtxt").open("a", encoding="utf-8") as config:
        config.write("response_cache { enable: true }\n")
    shared = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    try:
        shared.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"the replicas share the Redis at 127.0.0.1:6379, which is down: {exc}")
    for key in shared.scan_iter(f"{KEY_PREFIX}*"):
        shared.delete(key)
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
        for key in shared.scan_iter(f"{KEY_PREFIX}*"):
            shared.delete(key)
        shared.close()


def test_a_killed_and_a_drained_replica_lose_no_request(
    cluster: tuple[str, list[Replica]],
) -> None:
    url, (killed, drained, steady) = cluster
    load = Load(url)
    load.start()
    try:
        load.wait_for_more(300, "load through nginx")
        assert all(r.successes() > 0 for r in (killed, drained, steady))  # balanced over all

        assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
        load.wait_for_more(300, "load after a replica was killed")
        steady_hits = steady.hits()

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
    # The shared cache: the repeated inputs were answered from it throughout (the steady
    # replica's hits grew after the kill; the restarted one's count from zero)...
    assert steady.hits() > steady_hits and drained.hits() > 0
    # ...and an answer one replica made is a hit on another, which executes nothing.
    value = 7777.0  # no load request sent it
    assert steady.ask(value) == value
    wait_until(_cached_in_redis, "steady's entry in Redis")
    hits_before, inferences_before = drained.hits(), drained.statistics()["inference_count"]
    assert drained.ask(value) == value
    assert drained.hits() == hits_before + 1
    assert drained.statistics()["inference_count"] == inferences_before


def _cached_in_redis() -> bool:
    """Whether Redis holds an entry for an input of 7777 (the only one holding that value:
    the load's values stay below 4000)."""
    shared = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    try:
        needle = np.float32(7777.0).tobytes()
        return any(needle in (shared.get(k) or b"") for k in shared.scan_iter(f"{KEY_PREFIX}*"))
    finally:
        shared.close()
