"""The Redis tier against the real Redis at 127.0.0.1:6379 (keys under a prefix of this
test run's own, deleted afterwards), and against redis-servers the tests start and kill."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from inferd.cache import (
    CacheConfigError,
    CacheSettings,
    LocalSettings,
    RedisSettings,
    ResponseCache,
)
from inferd.cache.breaker import FAILURES, Breaker
from inferd.cache.entry import make_entry, owned_copy
from inferd.cache.redis_tier import RedisTier
from inferd.metrics.cache_families import CacheCollector
from tests.support.cache_helpers import Model, key, outputs, wait_for
from tests.support.redis_servers import MAIN_REDIS, OwnRedis, silent_listener

MAIN = RedisSettings(*MAIN_REDIS, timeout_ms=2000)  # a loaded CI box: no spurious timeouts


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"inferd:test:cache-core:{uuid.uuid4().hex}:"
    yield name
    client = redis.Redis(*MAIN_REDIS)
    stale = list(client.scan_iter(match=name + "*"))
    if stale:
        client.delete(*stale)
    client.close()


def main_redis() -> redis.Redis:
    return redis.Redis(*MAIN_REDIS)


def breaker_of(cache: ResponseCache) -> Breaker:
    """The lookups' breaker."""
    assert cache.redis is not None
    return cache.redis.lookup_breaker


def insert_breaker_of(cache: ResponseCache) -> Breaker:
    assert cache.redis is not None
    return cache.redis.insert_breaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_second_cache_hits_what_the_first_stored_and_fills_its_local_tier(prefix):
    async def scenario():
        writer = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        reader = ResponseCache(CacheSettings(LocalSettings(1 << 20), MAIN), redis_key_prefix=prefix)
        model = Model()
        assert (await writer.get_or_run(key(5), "m", model.run(5)))[1] == ""
        await writer.flush()
        got, source = await reader.get_or_run(key(5), "m", model.run(5))
        assert source == "redis" and model.calls == 1
        assert got[0].data.tolist() == [5.0] * 4 and not got[0].data.flags.writeable
        assert (await reader.get_or_run(key(5), "m", model.run(5)))[1] == "local"
        local, shared = reader.stats
        assert (local.tier, local.hits, local.misses, local.entries) == ("local", 1, 1, 1)
        assert (shared.tier, shared.hits, shared.misses, shared.errors) == ("redis", 1, 0, 0)
        assert writer.stats[0].inserts == 1 and writer.stats[0].misses == 1
        assert shared.lookup_seconds.count == 1 and writer.stats[0].insert_seconds.count == 1
        await writer.close()
        await reader.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("tier_ttl", "model_ttl", "expected"),
    [(None, None, None), (100, None, 100), (100, 30, 30), (None, 2.5, 3)],
)
def test_entries_carry_the_ttl(prefix, tier_ttl, model_ttl, expected):
    async def scenario():
        settings = RedisSettings(*MAIN_REDIS, ttl_s=tier_ttl, timeout_ms=2000)
        cache = ResponseCache(CacheSettings(redis=settings), redis_key_prefix=prefix)
        await cache.get_or_run(key(1), "m", Model().run(1), ttl_s=model_ttl)
        await cache.flush()
        await cache.close()

    asyncio.run(scenario())
    client = main_redis()
    (name,) = client.keys(prefix + "*")
    ttl = client.ttl(name)
    if expected is None:
        assert ttl == -1  # no expiry
    else:
        assert 0 < ttl <= expected
    client.close()


def test_values_are_compact_raw_bytes_behind_a_small_header(prefix):
    async def scenario():
        cache = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        await cache.get_or_run(key(1), "m", Model().run(1, size=10_000))
        await cache.flush()
        await cache.close()

    asyncio.run(scenario())
    client = main_redis()
    (name,) = client.keys(prefix + "*")
    assert name == (prefix + key(1).digest.hex()).encode()
    value = client.get(name)
    assert isinstance(value, bytes)
    raw = 10_000 * 4 + len(key(1).description)
    assert raw <= len(value) <= raw + 64
    assert np.frombuffer(value[-40_000:], "<f4").tolist() == [1.0] * 10_000
    client.close()


def test_a_corrupt_value_is_an_error_and_a_miss(prefix):
    client = main_redis()
    client.set(prefix + key(1).digest.hex(), b"IFDC\x01\xff\xff")  # truncated
    client.set(prefix + key(2).digest.hex(), b'{"not": "ours"}')
    client.close()

    async def scenario():
        cache = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        model = Model()
        for n in (1, 2):
            got, source = await cache.get_or_run(key(n), "m", model.run(n))
            assert source == "" and got[0].data[0] == n
        stats = cache.stats[0]
        assert (model.calls, stats.errors, stats.misses, stats.hits) == (2, 2, 2, 0)
        assert not breaker_of(cache).is_open  # Redis answered: it is the value that is bad
        await cache.close()

    asyncio.run(scenario())


def test_a_value_for_another_description_is_a_miss(prefix):
    """A digest collision across processes: the stored description differs, so no hit."""

    async def scenario():
        from inferd.cache import CacheKey

        cache = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        model = Model()
        await cache.get_or_run(CacheKey(b"\x07" * 16, b"a"), "m", model.run(1))
        await cache.flush()
        got, source = await cache.get_or_run(CacheKey(b"\x07" * 16, b"b"), "m", model.run(2))
        assert source == "" and got[0].data[0] == 2.0
        assert cache.stats[0].collisions == 1 and cache.stats[0].errors == 0
        await cache.close()

    asyncio.run(scenario())


async def served_without_trying_redis(cache: ResponseCache, model: Model, ns: range) -> None:
    """With both breakers open: the model answers, Redis is not even tried (no error, no
    insert), each lookup counted as skipped, each insert as dropped for the breaker."""
    stats = cache.stats[-1]
    errors, skipped, calls = stats.errors, stats.skipped, model.calls
    dropped = stats.dropped_by_reason["breaker_open"]
    for n in ns:
        got, source = await cache.get_or_run(key(n), "m", model.run(n))
        assert source == "" and got[0].data[0] == n
    await cache.flush()
    assert stats.errors == errors and stats.skipped == skipped + len(ns)
    assert stats.dropped_by_reason["breaker_open"] == dropped + len(ns)
    assert model.calls == calls + len(ns)


def test_a_redis_outage_degrades_to_no_cache_and_the_breaker_recovers():
    server = OwnRedis()
    server.start()
    try:
        asyncio.run(outage(server))
    finally:
        server.kill()


async def outage(server: OwnRedis) -> None:
    clock = Clock()
    settings = RedisSettings("127.0.0.1", server.port, timeout_ms=2000)
    cache = ResponseCache(CacheSettings(redis=settings), clock=clock)
    model = Model()
    stats, lookups, inserts = cache.stats[0], breaker_of(cache), insert_breaker_of(cache)
    await cache.get_or_run(key(1), "m", model.run(1))
    await cache.flush()
    assert (await cache.get_or_run(key(1), "m", model.run(1)))[1] == "redis"

    server.kill()
    n = 1
    while not (lookups.is_open and inserts.is_open):  # every request answered, by the model
        n += 1
        assert n <= 1 + 2 * FAILURES, "the breakers did not open"
        got, source = await cache.get_or_run(key(n), "m", model.run(n))
        assert source == "" and got[0].data[0] == n
        await cache.flush()  # each miss's insert a batch of its own, unless some queued up
    # Each breaker opened after FAILURES failures of its own calls, and calls Redis no more.
    errors = stats.errors
    assert errors == 2 * FAILURES
    assert stats.dropped_by_reason["failed"] >= FAILURES
    await served_without_trying_redis(cache, model, range(100, 110))

    clock.now += lookups.open_s  # both probes are due; Redis is still down: open again
    assert (await cache.get_or_run(key(20), "m", model.run(20)))[1] == ""
    await cache.flush()
    assert stats.errors == errors + 2 and lookups.opens == inserts.opens == 2

    server.start()  # the same port
    clock.now += lookups.open_s
    assert (await cache.get_or_run(key(21), "m", model.run(21)))[1] == ""  # the probe: a miss
    await cache.flush()  # the inserts' own probe: key(21) written
    assert not lookups.is_open and not inserts.is_open
    got, source = await cache.get_or_run(key(21), "m", model.run(21))
    assert source == "redis" and got[0].data[0] == 21.0
    await cache.close()


def test_a_redis_that_never_answers_is_bounded_by_timeout_ms():
    async def scenario(port: int) -> None:
        settings = RedisSettings("127.0.0.1", port, timeout_ms=50, insert_timeout_ms=50)
        cache = ResponseCache(CacheSettings(redis=settings))
        model = Model()
        stats = cache.stats[0]
        async with asyncio.timeout(30):  # hung calls would fail here, not pass
            for n in range(FAILURES):  # lookups in a row: each bounded, each a failure
                got, source = await cache.get_or_run(key(n), "m", model.run(n))
                assert source == "" and got[0].data[0] == n
            assert breaker_of(cache).is_open and stats.lookup_timeouts == FAILURES
            n = FAILURES
            while not insert_breaker_of(cache).is_open:  # each bounded by insert_timeout_ms
                await cache.flush()
                n += 1
                assert n <= 2 * FAILURES, "the inserts' breaker did not open"
                await cache.get_or_run(key(n), "m", model.run(n))
            assert stats.insert_timeouts == FAILURES
            await served_without_trying_redis(cache, model, range(100, 105))
        metrics = scraped(cache)  # the tier's state, as /metrics shows it
        for operation in ("lookup", "insert"):
            labels = (("operation", operation), ("tier", "redis"))
            assert metrics[("inferd_cache_timeouts_total", labels)] == FAILURES
            assert metrics[("inferd_cache_breaker_open", labels)] == 1
            assert metrics[("inferd_cache_breaker_opens_total", labels)] == 1
        dropped = (("reason", "breaker_open"), ("tier", "redis"))
        refused = stats.dropped_by_reason["breaker_open"]
        assert metrics[("inferd_cache_dropped_inserts_total", dropped)] == refused >= 5
        await cache.close()

    with silent_listener() as port:
        asyncio.run(scenario(port))


def scraped(cache: ResponseCache) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The cache's Prometheus samples: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in CacheCollector(cache).collect()
        for sample in family.samples
    }


def test_a_full_insert_queue_drops_and_counts(prefix):
    async def scenario():
        tier = RedisTier(MAIN, queue_items=2, key_prefix=prefix)
        for n in range(5):  # no await between: the worker cannot drain meanwhile
            tier.put(key(n), make_entry(key(n).description, owned_copy(outputs(n))), 60)
        assert tier.stats.dropped_inserts == 3
        await tier.flush()
        assert tier.stats.inserts == 2 and tier.stats.dropped_inserts == 3
        await tier.close()

    asyncio.run(scenario())
    client = main_redis()
    assert len(client.keys(prefix + "*")) == 2  # what was queued was written
    client.close()


def test_redis_settings_without_the_package_say_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(CacheConfigError, match=r"pip install 'inferd\[redis\]'"):
        ResponseCache(CacheSettings(redis=MAIN))
    ResponseCache(CacheSettings(local=LocalSettings(1024)))  # the local tier needs nothing


def test_identical_misses_look_redis_up_once_and_run_once(prefix):
    async def scenario():
        cache = ResponseCache(CacheSettings(LocalSettings(1 << 20), MAIN), redis_key_prefix=prefix)
        model = Model()
        model.gate.clear()
        tasks = [
            asyncio.create_task(cache.get_or_run(key(3), "m", model.run(3))) for _ in range(64)
        ]
        await wait_for(lambda: cache.coalesced == 63 and model.started.is_set())
        model.gate.set()
        results = await asyncio.gather(*tasks)
        assert model.calls == 1 and {source for _, source in results} == {""}
        local, shared = cache.stats
        assert (local.misses, shared.misses, shared.hits) == (64, 1, 0)
        await cache.close()

    asyncio.run(scenario())


def test_the_redis_ttl_bounds_local_copies_too(prefix):
    async def scenario():
        clock = Clock()
        settings = CacheSettings(
            LocalSettings(1 << 20), RedisSettings(*MAIN_REDIS, ttl_s=10, timeout_ms=2000)
        )
        cache = ResponseCache(settings, clock=clock, redis_key_prefix=prefix)
        model = Model()
        await cache.get_or_run(key(1), "m", model.run(1))
        await cache.flush()
        clock.now += 9
        assert (await cache.get_or_run(key(1), "m", model.run(1)))[1] == "local"
        clock.now += 1  # the local copy expired; Redis (real time) still holds it
        assert (await cache.get_or_run(key(1), "m", model.run(1)))[1] == "redis"
        assert model.calls == 1 and cache.stats[0].expired == 1
        await cache.close()

    asyncio.run(scenario())


def test_an_acl_user_and_password_authenticate_and_a_wrong_one_is_only_a_miss():
    server = OwnRedis()
    server.start()
    try:
        admin = redis.Redis("127.0.0.1", server.port)
        admin.acl_setuser(
            "app", enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all"]
        )
        admin.close()

        async def scenario() -> None:
            right = RedisSettings("127.0.0.1", server.port, "s3cret", timeout_ms=2000, user="app")
            cache = ResponseCache(CacheSettings(redis=right))
            model = Model()
            await cache.get_or_run(key(1), "m", model.run(1))
            await cache.flush()
            assert (await cache.get_or_run(key(1), "m", model.run(1)))[1] == "redis"
            assert cache.stats[0].errors == 0
            await cache.close()

            wrong = RedisSettings("127.0.0.1", server.port, "nope", timeout_ms=2000, user="app")
            cache = ResponseCache(CacheSettings(redis=wrong))
            got, source = await cache.get_or_run(key(1), "m", model.run(1))
            assert source == "" and got[0].data[0] == 1.0 and cache.stats[0].errors == 1
            await cache.close()

        asyncio.run(scenario())
    finally:
        server.kill()


def test_a_bounded_pool_makes_callers_wait_for_a_connection_not_fail(prefix):
    async def scenario() -> None:
        settings = RedisSettings(*MAIN_REDIS, timeout_ms=5000, pool_size=2, wait_timeout_ms=0)
        cache = ResponseCache(CacheSettings(redis=settings), redis_key_prefix=prefix)
        model = Model()
        results = await asyncio.gather(
            *(cache.get_or_run(key(n), "m", model.run(n)) for n in range(32))
        )
        assert [got[0].data[0] for got, _ in results] == list(range(32))
        await cache.flush()
        results = await asyncio.gather(
            *(cache.get_or_run(key(n), "m", model.run(n)) for n in range(32))
        )
        assert {source for _, source in results} == {"redis"}
        assert cache.stats[0].errors == 0 and model.calls == 32
        assert cache.redis is not None and cache.redis._pool.max_connections == 2
        await cache.close()

    asyncio.run(scenario())


LEFT_OPEN = """
import asyncio
from inferd.cache import CacheSettings, RedisSettings, ResponseCache
from tests.support.cache_helpers import Model, key

async def left_open(n):
    settings = RedisSettings("127.0.0.1", 6379, timeout_ms=2000)
    cache = ResponseCache(CacheSettings(redis=settings), redis_key_prefix=PREFIX)
    await cache.get_or_run(key(n), "m", Model().run(n))  # queues its insert
    lookup = asyncio.create_task(cache.get_or_run(key(n + 100), "m", Model().run(n)))
    for _ in range(n % 10):  # let the worker (and that lookup) get that far
        await asyncio.sleep(0)
    raise RuntimeError("the scenario fails before cache.close()")

for n in range(40):
    try:
        asyncio.run(left_open(n))
    except RuntimeError:
        pass
print("ended")
"""


def test_a_loop_ending_with_the_cache_open_does_not_hang(prefix):
    """asyncio.run cancels the insert worker mid-write; redis-py 8.1 swallows that cancel,
    and without _reraise_swallowed_cancel the worker waited for its next insert for ever
    (seen: this script then hangs within its 40 runs; in a subprocess, so it fails)."""
    import subprocess

    code = f"PREFIX = {prefix!r}\n" + LEFT_OPEN
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ended", done.stderr[-2000:]


def test_concurrent_lookups_go_out_as_one_mget(prefix):
    async def scenario() -> None:
        writer = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        model = Model()
        for n in range(0, 32, 2):  # the even ones are stored, the odd ones are not
            await writer.get_or_run(key(n), "m", model.run(n))
        await writer.flush()
        await writer.close()

        reader = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        results = await asyncio.gather(
            *(reader.get_or_run(key(n), "m", model.run(n)) for n in range(32))
        )
        assert [got[0].data[0] for got, _ in results] == list(range(32))
        assert [source for _, source in results] == ["redis", ""] * 16
        assert reader.redis is not None and reader.redis._lookups is not None
        assert reader.redis._lookups.batches == 1  # 32 lookups, one round trip
        assert (reader.stats[0].hits, reader.stats[0].misses) == (16, 16)
        await reader.close()

    asyncio.run(scenario())


# -- one breaker per operation (issue 34) ------------------------------------------------------


def test_inserts_timing_out_open_only_the_inserts_breaker(prefix):
    """Slow background inserts drop inserts, counted; lookups go on hitting."""

    async def scenario() -> None:
        writer = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        await writer.get_or_run(key(1), "m", Model().run(1))
        await writer.close()  # key(1) stored
        settings = RedisSettings(*MAIN_REDIS, timeout_ms=2000, insert_timeout_ms=0.001)
        cache = ResponseCache(CacheSettings(redis=settings), redis_key_prefix=prefix)
        stats, model = cache.stats[0], Model()
        for n in range(2, 2 + FAILURES):  # misses: each insert a batch of its own, timing out
            assert (await cache.get_or_run(key(n), "m", model.run(n)))[1] == ""
            await cache.flush()
        assert insert_breaker_of(cache).is_open and not breaker_of(cache).is_open
        assert stats.insert_timeouts == FAILURES and stats.lookup_timeouts == 0
        assert stats.dropped_by_reason["failed"] == FAILURES and stats.inserts == 0
        got, source = await cache.get_or_run(key(1), "m", model.run(1))
        assert source == "redis" and got[0].data[0] == 1  # lookups go on
        await cache.get_or_run(key(9), "m", model.run(9))
        assert stats.dropped_by_reason["breaker_open"] == 1  # inserts are dropped, counted
        assert stats.skipped == 0
        await cache.close()

    asyncio.run(scenario())


def test_lookups_timing_out_open_only_the_lookups_breaker(prefix):
    """Lookups out of their bound are misses and skip Redis a while; the answers the model
    made meanwhile are still written for the other replicas."""

    async def scenario() -> None:
        settings = RedisSettings(*MAIN_REDIS, timeout_ms=0.001)  # inserts: the default bound
        cache = ResponseCache(CacheSettings(redis=settings), redis_key_prefix=prefix)
        stats, model = cache.stats[0], Model()
        for n in range(FAILURES):  # one after the other: each failure counts
            assert (await cache.get_or_run(key(n), "m", model.run(n)))[1] == ""
        assert breaker_of(cache).is_open and not insert_breaker_of(cache).is_open
        assert stats.lookup_timeouts == FAILURES
        await served_lookups_skipped(cache, model, range(10, 13))
        await cache.flush()
        assert stats.inserts == FAILURES + 3 and stats.dropped_inserts == 0
        await cache.close()

    asyncio.run(scenario())
    client = main_redis()
    assert len(client.keys(prefix + "*")) == FAILURES + 3
    client.close()


async def served_lookups_skipped(cache: ResponseCache, model: Model, ns: range) -> None:
    stats = cache.stats[-1]
    skipped, errors = stats.skipped, stats.errors
    for n in ns:
        got, source = await cache.get_or_run(key(n), "m", model.run(n))
        assert source == "" and got[0].data[0] == n
    assert stats.skipped == skipped + len(ns) and stats.errors == errors


def test_the_inserts_breaker_probes_and_closes_by_itself():
    """No lookup is needed to find Redis back: the inserts' own probe does."""
    server = OwnRedis()
    server.start()
    try:
        asyncio.run(inserts_only(server))
    finally:
        server.kill()


async def inserts_only(server: OwnRedis) -> None:
    clock = Clock()
    tier = RedisTier(RedisSettings("127.0.0.1", server.port, timeout_ms=2000), clock=clock)

    def put(n: int) -> None:
        tier.put(key(n), make_entry(key(n).description, owned_copy(outputs(n))), 60)

    server.kill()
    for n in range(FAILURES):
        put(n)
        await tier.flush()
    assert tier.insert_breaker.is_open and tier.stats.dropped_by_reason["failed"] == FAILURES
    put(10)
    assert tier.stats.dropped_by_reason["breaker_open"] == 1  # not even queued
    server.start()
    clock.now += tier.insert_breaker.open_s
    put(11)  # the probe
    await tier.flush()
    assert not tier.insert_breaker.is_open and tier.stats.inserts == 1
    assert not tier.lookup_breaker.is_open and tier.stats.skipped == 0  # never involved
    await tier.close()
    client = redis.Redis("127.0.0.1", server.port)
    assert client.dbsize() == 1
    client.close()


def test_lookups_that_fail_together_are_one_failure_of_the_breaker():
    """Five MGETs in flight at once, all timing out together (what a stall of this process
    does to every pending call): one failure, the breaker stays closed. Two more, each sent
    after the last failed, open it."""

    async def scenario(port: int) -> None:
        settings = RedisSettings("127.0.0.1", port, timeout_ms=300, insert_timeout_ms=50)
        cache = ResponseCache(CacheSettings(redis=settings))
        stats, model, breaker = cache.stats[0], Model(), breaker_of(cache)
        calls = []
        for n in range(5):  # a turn each: five MGETs
            calls.append(asyncio.create_task(cache.get_or_run(key(n), "m", model.run(n))))
            await asyncio.sleep(0)
        async with asyncio.timeout(30):
            results = await asyncio.gather(*calls)
        assert [source for _, source in results] == [""] * 5
        assert cache.redis is not None and cache.redis._lookups is not None
        assert cache.redis._lookups.batches == 5 and stats.lookup_timeouts == 5
        assert breaker.consecutive == 1 and not breaker.is_open
        for n in range(10, 10 + FAILURES - 1):
            await cache.get_or_run(key(n), "m", model.run(n))
        assert breaker.is_open and breaker.opens == 1
        await cache.close()

    with silent_listener() as port:
        asyncio.run(scenario(port))
