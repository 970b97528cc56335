"""The Redis tier's `entries` and `bytes`, counted in Redis in the background
(cache/redis_usage.py), against the real Redis at 127.0.0.1:6379 under a prefix of the test's
own, and against a silent listener: real figures, or unknown (-1, not exported), never a
partial or made-up count."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from inferd.cache import CacheSettings, RedisSettings, ResponseCache, TierStats
from inferd.cache.breaker import Breaker
from inferd.cache.redis_usage import RedisUsage, glob_escaped
from inferd.metrics.cache_families import CacheCollector
from tests.support.cache_helpers import Model, key, wait_for
from tests.support.redis_servers import MAIN_REDIS, silent_listener

MAIN = RedisSettings(*MAIN_REDIS, timeout_ms=2000)


@pytest.fixture
def prefix() -> Iterator[str]:
    # A `*` and a `[` in it: the walk's pattern must take them literally.
    name = f"inferd:test:usage:{uuid.uuid4().hex}:*[a]:"
    yield name
    client = redis.Redis(*MAIN_REDIS)
    stale = list(client.scan_iter(match=glob_escaped(name) + "*"))
    if stale:
        client.delete(*stale)
    client.close()


def _stored(prefix: str) -> tuple[int, int]:
    """What Redis holds under `prefix`, asked directly: (keys, bytes of their values)."""
    client = redis.Redis(*MAIN_REDIS)
    names = set(client.scan_iter(match=glob_escaped(prefix) + "*"))
    size = sum(client.strlen(n) for n in names)
    client.close()
    return len(names), size


def _gauges(cache: ResponseCache) -> dict[tuple[str, str], float]:
    """The cache's gauges as /metrics exports them: (name, tier) -> value."""
    found = {}
    for family in CacheCollector(cache).collect():
        if family.name in ("inferd_cache_entries", "inferd_cache_bytes"):
            for sample in family.samples:
                found[(family.name, sample.labels["tier"])] = sample.value
    return found


def test_the_tier_counts_its_entries_and_bytes_in_redis_and_exports_them(prefix):
    async def scenario():
        cache = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        await cache.start()
        assert cache.redis is not None and cache.redis.usage is not None
        usage = cache.redis.usage
        await wait_for(lambda: usage.walks >= 1)  # the first walk, at start: nothing yet
        assert (cache.redis.stats.entries, cache.redis.stats.bytes) == (0, 0)
        for n in range(5):
            await cache.get_or_run(key(n), "m", Model().run(n, size=100 + n))
        await cache.flush()
        # Another process's entry under the same prefix counts too: the tier is shared.
        other = ResponseCache(CacheSettings(redis=MAIN), redis_key_prefix=prefix)
        await other.get_or_run(key(99), "m", Model().run(99))
        await other.flush()
        await other.close()
        await usage.refresh()  # the next walk (every 30 s in the background)
        stats = cache.redis.stats
        assert (stats.entries, stats.bytes) == _stored(prefix)
        assert stats.entries == 6 and stats.bytes > 5 * 400
        gauges = _gauges(cache)
        assert gauges[("inferd_cache_entries", "redis")] == 6
        assert gauges[("inferd_cache_bytes", "redis")] == stats.bytes
        await cache.close()

    asyncio.run(scenario())


def _usage(port: int, prefix: str, call_s: float = 1.0) -> RedisUsage:
    client = redis.asyncio.Redis(host="127.0.0.1", port=port)
    stats = TierStats("redis", bytes=-1, entries=-1)
    return RedisUsage(client, prefix, stats, Breaker(), call_s=call_s)


def test_a_walk_past_max_keys_leaves_the_figures_unknown_not_partial(prefix):
    client = redis.Redis(*MAIN_REDIS)
    client.mset({f"{prefix}{n}": b"x" * 10 for n in range(30)})
    client.close()

    async def scenario():
        usage = _usage(MAIN_REDIS[1], prefix)
        usage.max_keys = 30
        await usage.refresh()
        assert (usage.stats.entries, usage.stats.bytes) == (30, 300)
        usage.max_keys = 29
        await usage.refresh()
        assert (usage.stats.entries, usage.stats.bytes) == (-1, -1)
        await usage.close()

    asyncio.run(scenario())


def test_an_unanswering_redis_or_an_open_breaker_leaves_them_unknown(prefix):
    async def scenario():
        with silent_listener() as port:
            usage = _usage(port, prefix, call_s=0.2)
            usage.stats.entries = usage.stats.bytes = 7  # a figure from an earlier walk
            await usage.refresh()
            assert (usage.stats.entries, usage.stats.bytes) == (-1, -1)
            await usage.close()
        usage = _usage(MAIN_REDIS[1], prefix)
        for _ in range(usage.breaker.failures):
            usage.breaker.failed()
        await usage.refresh()
        assert (usage.stats.entries, usage.stats.bytes, usage.walks) == (-1, -1, 0)
        usage.breaker.succeeded()
        await usage.refresh()
        assert (usage.stats.entries, usage.stats.bytes, usage.walks) == (0, 0, 1)
        await usage.close()

    asyncio.run(scenario())


def test_unknown_figures_are_not_exported():
    async def scenario():
        with silent_listener() as port:
            settings = RedisSettings("127.0.0.1", port, timeout_ms=50)
            cache = ResponseCache(CacheSettings(redis=settings))
            await cache.start()
            assert _gauges(cache) == {}  # -1: absent, never a made-up number
            await cache.close()

    asyncio.run(scenario())
