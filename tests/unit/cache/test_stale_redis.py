"""Entries kept past their TTL (stale_s) in the real Redis at 127.0.0.1:6379, database 14
(these tests' own, flushed around each): PX covers ttl + stale_s, the normal lookup treats
such an entry as expired past its fresh-until, the stale lookup answers with it and fills
the local tier with its times, and without stale_s the value is the plain codec form.
Wall and monotonic clocks are injected: no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from inferd.cache import CacheSettings, LocalSettings, RedisSettings, ResponseCache
from inferd.cache import redis_encoding as codec
from inferd.cache.breaker import FAILURES
from inferd.cache.redis_tier import KEY_PREFIX
from tests.support.cache_helpers import Model, key
from tests.support.redis_servers import MAIN_REDIS, silent_listener

DB = 14
SETTINGS = RedisSettings(*MAIN_REDIS, db=DB, timeout_ms=2000)  # a loaded box: no timeouts


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis(*MAIN_REDIS, db=DB)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def name_of(n: float) -> str:
    return KEY_PREFIX + key(n).digest.hex()


def caches(wall: Clock, mono: Clock, local: bool = False) -> ResponseCache:
    tiers = CacheSettings(LocalSettings(1 << 20) if local else None, SETTINGS)
    return ResponseCache(tiers, clock=mono, wall_clock=wall)


def test_a_kept_entry_is_expired_for_get_or_run_and_a_stale_answer_for_lookup_stale(client):
    async def scenario():
        wall, mono = Clock(1_700_000_000.0), Clock(1000.0)
        cache, model = caches(wall, mono), Model()
        await cache.get_or_run(key(1), "m", model.run(1), ttl_s=10, stale_s=50)
        await cache.flush()
        assert 59_000 < client.pttl(name_of(1)) <= 60_000  # PX: ttl + stale_s
        stored = client.get(name_of(1))
        assert stored is not None and codec.unwrap(stored)[1:] == (wall.now + 10, wall.now + 60)
        stats = cache.stats[0]
        found = await cache.lookup_stale(key(1), "m")
        assert found is not None and not found[1] and stats.hits == 1
        wall.now += 10  # past fresh-until: Redis still holds it
        got, stale = await cache.lookup_stale(key(1), "m") or ([], False)
        assert stale and got[0].data.tolist() == [1.0] * 4
        assert (stats.hits, stats.stale_hits) == (1, 1)
        # The normal lookup: expired and a miss; the model runs and its insert replaces it.
        got, source = await cache.get_or_run(key(1), "m", model.run(2), ttl_s=10, stale_s=50)
        assert source == "" and got[0].data.tolist() == [2.0] * 4 and model.calls == 2
        assert (stats.expired, stats.misses, stats.hits) == (1, 2, 1)
        await cache.flush()
        assert codec.unwrap(client.get(name_of(1)))[1] == wall.now + 10
        found = await cache.lookup_stale(key(1), "m")
        assert found is not None and not found[1] and found[0][0].data.tolist() == [2.0] * 4
        assert await cache.lookup_stale(key(9), "m") is None
        assert (stats.misses, stats.hits, stats.stale_hits) == (3, 2, 1)
        await cache.close()

    asyncio.run(scenario())


def test_a_stale_redis_answer_fills_the_local_tier_with_its_times(client):
    async def scenario():
        wall, mono = Clock(1_700_000_000.0), Clock(1000.0)
        writer = caches(wall, mono)
        await writer.get_or_run(key(1), "m", Model().run(1), ttl_s=10, stale_s=50)
        await writer.flush()
        wall.now += 20
        mono.now += 20  # 10 s past fresh-until, 40 s before keep-until
        reader = caches(wall, mono, local=True)
        found = await reader.lookup_stale(key(1), "m")
        assert found is not None and found[1]
        local, shared = reader.stats
        assert (local.misses, shared.stale_hits, local.entries) == (1, 1, 1)
        found = await reader.lookup_stale(key(1), "m")  # the local copy now, still stale
        assert found is not None and found[1] and local.stale_hits == 1
        assert shared.stale_hits == 1  # Redis not asked again
        model = Model()  # and the normal lookup: the local copy is expired too
        assert (await reader.get_or_run(key(1), "m", model.run(3), ttl_s=10))[1] == ""
        assert model.calls == 1 and local.expired == 1 and shared.expired == 1
        await writer.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_local_copy_of_a_kept_redis_entry_ends_at_its_keep_until(client):
    async def scenario():
        wall, mono = Clock(1_700_000_000.0), Clock(1000.0)
        writer = caches(wall, mono)
        await writer.get_or_run(key(1), "m", Model().run(1), ttl_s=10, stale_s=50)
        await writer.flush()
        wall.now += 5
        mono.now += 5
        reader = caches(wall, mono, local=True)
        found = await reader.lookup_stale(key(1), "m")  # fresh from Redis: copied locally
        assert found is not None and not found[1]
        local = reader.stats[0]
        mono.now += 5  # the Redis entry's fresh-until, on the local clock too
        assert (await reader.lookup_stale(key(1), "m") or ([], False))[1]
        mono.now += 50  # its keep-until: the local copy is gone
        assert reader.local is not None and reader.local.lookup(key(1), "m") is None
        assert (local.entries, local.expired) == (0, 1)
        await writer.close()
        await reader.close()

    asyncio.run(scenario())


def test_without_stale_s_the_value_and_its_px_are_as_before(client):
    async def scenario():
        wall, mono = Clock(1_700_000_000.0), Clock(1000.0)
        cache = caches(wall, mono)
        await cache.get_or_run(key(1), "m", Model().run(1), ttl_s=10)
        await cache.get_or_run(key(2), "m", Model().run(2), stale_s=50)  # no TTL: not kept
        await cache.flush()
        assert 9_000 < client.pttl(name_of(1)) <= 10_000
        assert client.pttl(name_of(2)) == -1  # no expiry
        for n in (1, 2):
            value = client.get(name_of(n))
            assert value is not None and value.startswith(codec.MAGIC)
        found = await cache.lookup_stale(key(1), "m")
        assert found is not None and not found[1]
        await cache.close()

    asyncio.run(scenario())


def test_a_normal_redis_hit_of_a_kept_entry_fills_the_local_tier_with_its_times(client):
    async def scenario():
        wall, mono = Clock(1_700_000_000.0), Clock(1000.0)
        writer = caches(wall, mono)
        await writer.get_or_run(key(1), "m", Model().run(1), ttl_s=10, stale_s=50)
        await writer.flush()
        wall.now += 5
        mono.now += 5
        reader, model = caches(wall, mono, local=True), Model()
        assert (await reader.get_or_run(key(1), "m", model.run(2), ttl_s=10, stale_s=50))[1] == (
            "redis"
        )
        # The Redis entry's fresh-until, not 10 s after the copy was made: local expired too.
        mono.now += 5
        wall.now += 5
        assert (await reader.get_or_run(key(1), "m", model.run(2), ttl_s=10, stale_s=50))[1] == ""
        assert model.calls == 1 and reader.stats[0].expired == reader.stats[1].expired == 1
        await writer.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_stale_lookup_is_bounded_by_the_timeout_and_the_breaker():
    async def scenario(port: int):
        settings = RedisSettings("127.0.0.1", port, timeout_ms=50)
        cache = ResponseCache(CacheSettings(redis=settings))
        for _ in range(FAILURES):
            assert await cache.lookup_stale(key(1), "m") is None
        stats = cache.stats[0]
        assert (stats.errors, stats.misses, stats.skipped) == (FAILURES, FAILURES, 0)
        assert await cache.lookup_stale(key(1), "m") is None  # the breaker is open now
        assert (stats.errors, stats.misses, stats.skipped) == (FAILURES, FAILURES + 1, 1)
        await cache.close()

    with silent_listener() as port:
        asyncio.run(scenario(port))
