"""The response cache across processes (docs/cache.md): two `inferd serve` processes sharing
hits through the real Redis at 127.0.0.1:6379, a Redis killed mid-load (one the test starts
on its own port) costing no request, `--workers 2 --engine` serving hits from the engine,
and `--cache-config` values refused at startup naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from inferd.cache.cache_settings import parse_cache_config
from inferd.cache.redis_tier import KEY_PREFIX
from tests.support.cache_models import param, write_exec_model
from tests.support.metrics_scrape import scrape_url, value
from tests.support.servers import free_port, run_cli_server, run_server

# The suite's Redis; a database of these tests' own, and only the cache's keys deleted.
REDIS_DB = 11
DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cache_redis_repo")
    write_exec_model(repo, "cached")
    return repo


@pytest.fixture
def shared_redis() -> Iterator[redis.Redis]:
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)

    def forget() -> None:
        for key in client.scan_iter(f"{KEY_PREFIX}*"):
            client.delete(key)

    forget()
    yield client
    forget()
    client.close()


def _body(values: list[float]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, len(values)], "data": values}]
    }


def _ask(url: str, values: list[float]) -> tuple[int, int]:
    """(HTTP status, the execution that answered), on a new connection."""
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/v2/models/cached/infer", json=_body(values))
    return r.status_code, (r.json()["outputs"][1]["data"][0] if r.status_code == 200 else -1)


def _stats(url: str) -> dict[str, Any]:
    entry: dict[str, Any] = httpx.get(f"{url}/v2/models/cached/stats", timeout=10).json()[
        "model_stats"
    ][0]
    return entry


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_two_processes_share_hits_through_redis(
    repo: Path, tmp_path: Path, shared_redis: redis.Redis
) -> None:
    values = [float(uuid.uuid4().int % 10_000), 1.0]  # this run's own key
    metrics_b = free_port()
    # One process in inferd's form with the default bounds, the other in Triton's (one
    # setting per flag), bounds given.
    metrics_a = free_port()
    a_args = [
        "--cache-config", f"redis,host=127.0.0.1,port=6379,db={REDIS_DB}",
        "--metrics-port", str(metrics_a),
    ]  # fmt: skip
    b_args = [
        "--cache-config", "redis,host=127.0.0.1", "--cache-config", "redis,port=6379",
        "--cache-config", f"redis,db={REDIS_DB}", "--cache-config", "redis,timeout_ms=200",
        "--cache-config", "redis,insert_timeout_ms=2000", "--metrics-port", str(metrics_b),
    ]  # fmt: skip
    with (
        run_cli_server(repo, tmp_path / "a.log", *a_args) as a,
        run_cli_server(repo, tmp_path / "b.log", *b_args) as b,
    ):
        status, made_by = _ask(a.url, values)
        assert status == 200
        # A's insert goes out in the background: wait until Redis holds it.
        try:
            _wait_for(lambda: any(shared_redis.scan_iter(f"{KEY_PREFIX}*")), "A's entry in Redis")
        except AssertionError:
            text = httpx.get(f"http://127.0.0.1:{metrics_a}/metrics").text
            raise AssertionError([line for line in text.splitlines() if "cache" in line]) from None
        assert _ask(b.url, values) == (200, made_by)  # A's execution's answer
        stats_b = _stats(b.url)
        assert stats_b["inference_stats"]["cache_hit"]["count"] == 1
        assert stats_b["inference_count"] == stats_b["execution_count"] == 0  # B ran nothing
        samples = scrape_url(f"http://127.0.0.1:{metrics_b}/metrics")
        assert value(samples, "inferd_cache_hits_total", tier="redis", model="cached") == 1


def test_workers_share_redis_and_their_cache_statistics_add_up(
    repo: Path, tmp_path: Path, shared_redis: redis.Redis
) -> None:
    values = [float(uuid.uuid4().int % 10_000), 2.0]
    with run_cli_server(
        repo, tmp_path / "workers.log", "--workers", "2", "--cache-config", "local,size=1M",
        "--cache-config", f"redis,host=127.0.0.1,port=6379,db={REDIS_DB},timeout_ms=200",
    ) as cli:  # fmt: skip
        first = _ask(cli.url, values)
        _wait_for(lambda: any(shared_redis.scan_iter(f"{KEY_PREFIX}*")), "the entry in Redis")
        # New connections: the kernel spreads them over both workers; each worker's first
        # is a Redis hit (filling its local tier), the rest local hits.
        assert [_ask(cli.url, values) for _ in range(8)] == [first] * 8
        entry = _stats(cli.url)  # one worker answers, with its sibling's numbers added
        assert entry["inference_count"] == 1
        assert entry["inference_stats"]["cache_miss"]["count"] == 1
        assert entry["inference_stats"]["cache_hit"]["count"] == 8


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(host="127.0.0.1", port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        _wait_for(up, "the test's redis-server")
        yield proc, port
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_a_redis_killed_mid_load_fails_no_request_and_is_counted(
    repo: Path, own_redis: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, port = own_redis
    settings = parse_cache_config([f"redis,host=127.0.0.1,port={port},timeout_ms=50"])
    total, answered = 300, 0
    lock = threading.Lock()
    reached = threading.Event()

    with run_server(repo, cache=settings) as server:

        def one(i: int) -> int:
            nonlocal answered
            status, _ = _ask(server.url, [float(i % 10)])  # ten keys: hits and misses
            with lock:
                answered += 1
                if answered == 100:
                    reached.set()
            return status

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(one, i) for i in range(total)]
            assert reached.wait(DEADLINE_S * 3)
            samples = scrape_url(server.metrics_url)
            hits_before = value(samples, "inferd_cache_hits_total", tier="redis", model="cached")
            with lock:
                left = total - answered  # at most 4 of them already past their lookup
            proc.kill()  # mid-load: the other threads keep sending
            statuses = [f.result() for f in futures]
        samples = scrape_url(server.metrics_url)
    assert statuses == [200] * total  # a Redis outage degrades to no cache, never to errors
    assert hits_before > 0  # Redis served hits before it died
    failures = value(samples, "inferd_cache_errors_total", tier="redis")
    skipped = value(samples, "inferd_cache_breaker_skips_total", tier="redis")
    assert failures > 0  # counted; and the breaker spared the rest their timeout
    assert failures + skipped >= left - 4
    # The tier's state is visible: each operation's breaker opened on its own failures and
    # is open still (Redis stayed down), and the inserts it refused are counted by reason.
    for operation in ("lookup", "insert"):
        labels = {"tier": "redis", "operation": operation}
        assert value(samples, "inferd_cache_breaker_open", **labels) == 1, operation
        assert value(samples, "inferd_cache_breaker_opens_total", **labels) >= 1, operation
    dropped = {
        reason: value(samples, "inferd_cache_dropped_inserts_total", tier="redis", reason=reason)
        for reason in ("queue_full", "breaker_open", "failed", "unencodable")
    }
    assert dropped["failed"] > 0 and dropped["breaker_open"] > 0, dropped


def test_the_engine_of_workers_2_engine_serves_hits(repo: Path, tmp_path: Path) -> None:
    metrics_port = free_port()
    with run_cli_server(
        repo, tmp_path / "engine.log", "--workers", "2", "--engine",
        "--cache-config", "local,size=1M", "--metrics-port", str(metrics_port),
    ) as cli:  # fmt: skip
        # New connections: the kernel may hand them to either front end; one engine caches.
        answers = [_ask(cli.url, [5.0, 6.0]) for _ in range(4)]
        assert answers == [answers[0]] * 4 and answers[0][0] == 200
        entry = _stats(cli.url)
        assert entry["inference_count"] == 1
        assert entry["inference_stats"]["cache_hit"]["count"] == 3
        samples = scrape_url(f"http://127.0.0.1:{metrics_port}/metrics")
        assert value(samples, "inferd_cache_hits_total", tier="local", model="cached") == 3


# -- bad values --------------------------------------------------------------------------------

# (the flags' values, words the error must say)
BAD = [
    (["local,size=lots"], ["--cache-config", "local", "size", "lots"]),
    (["local,size=0"], ["--cache-config", "local", "size"]),
    (["redis,port=6379"], ["--cache-config", "redis", "host"]),
    (["redis,host=h,port=70000"], ["--cache-config", "redis", "port", "70000"]),
    (["redis,host=h,colour=blue"], ["--cache-config", "redis", "colour"]),
    (["memcached,size=1"], ["--cache-config", "memcached"]),
]


@pytest.mark.parametrize(("values", "words"), BAD, ids=[v[0] for v, _ in BAD])
def test_a_bad_cache_config_fails_startup_naming_the_setting(
    repo: Path, values: list[str], words: list[str]
) -> None:
    args = [a for v in values for a in ("--cache-config", v)]
    result = _serve(repo, args)
    assert result.returncode == 2, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_the_cache_config_is_read_from_the_environment_too(repo: Path) -> None:
    result = _serve(repo, [], {"INFERD_CACHE_CONFIG": "redis,host=h redis,port=nope"})
    assert result.returncode == 2, result.stderr
    assert "redis" in result.stderr and "port" in result.stderr and "nope" in result.stderr


def _serve(
    repo: Path, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repo),
         "--http-port", str(free_port()), "--grpc-port", "0", "--metrics-port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_cache_max_entries_without_a_local_tier_fails_the_models_load(tmp_path: Path) -> None:
    """cache_max_entries bounds the local tier: on a Redis-only cache it would do nothing, so
    the model's load fails naming the file and parameter (the others serve)."""
    repo = tmp_path / "models"
    write_exec_model(repo, "bounded", extra=param("cache_max_entries", "2"))
    write_exec_model(repo, "fine")
    settings = parse_cache_config([f"redis,host=127.0.0.1,port=6379,db={REDIS_DB}"])
    with run_server(repo, cache=settings) as server, httpx.Client(base_url=server.url) as c:
        assert c.get("/v2/models/fine/ready").status_code == 200
        r = c.post("/v2/models/bounded/infer", json=_body([1.0]))
        assert r.status_code == 503
        assert "bounded/config.pbtxt: parameters.cache_max_entries" in r.text
        assert "no local tier" in r.text
