"""Entries kept past their TTL (stale_s) in the local tier, for a degraded model's
lookup_stale (docs/cache.md, "Stale entries"): normal lookups see them as expired, the
stale lookup answers with them until keep-until, and they count like any entry. Clocks are
injected: no sleeps."""

from __future__ import annotations

import asyncio

from inferd.cache import CacheSettings, LocalSettings, ResponseCache
from inferd.cache.entry import make_entry, owned_copy
from inferd.cache.local_tier import LocalTier
from inferd.metrics.cache_families import CacheCollector
from tests.support.cache_helpers import Model, key, outputs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(n: float, size: int = 4):
    return make_entry(key(n).description, owned_copy(outputs(n, size)))


def local_cache(clock: Clock, size: int = 1 << 20) -> ResponseCache:
    return ResponseCache(CacheSettings(local=LocalSettings(size)), clock=clock)


def test_past_its_ttl_a_kept_entry_is_a_miss_rerun_and_a_stale_answer_until_kept_no_more():
    async def scenario():
        clock = Clock()
        cache, model = local_cache(clock), Model()
        assert (await cache.get_or_run(key(1), "m", model.run(1), ttl_s=10, stale_s=5))[1] == ""
        clock.now += 9.9
        assert await cache.lookup_stale(key(1), "m") is not None
        found = await cache.lookup_stale(key(1), "m")
        assert found is not None and found[1] is False  # fresh
        clock.now += 0.1  # past the TTL, within stale_s
        stats = cache.stats[0]
        got, stale = await cache.lookup_stale(key(1), "m") or ([], False)
        assert stale and got[0].data.tolist() == [1.0] * 4
        assert (stats.hits, stats.stale_hits, stats.expired) == (2, 1, 0)
        # The normal lookup: expired, a miss, and the model runs again, replacing it.
        model.gate.clear()
        model.started.clear()
        rerun = asyncio.ensure_future(
            cache.get_or_run(key(1), "m", model.run(2), ttl_s=10, stale_s=5)
        )
        await model.started.wait()
        assert (stats.expired, stats.misses, model.calls) == (1, 2, 2)
        # While it runs (a degraded model is slow), the stale lookup still answers.
        stale_while_running = await cache.lookup_stale(key(1), "m")
        assert stale_while_running is not None and stale_while_running[1]
        assert stale_while_running[0][0].data.tolist() == [1.0] * 4
        model.gate.set()
        assert (await rerun)[1] == ""
        found = await cache.lookup_stale(key(1), "m")
        assert found is not None and not found[1] and found[0][0].data.tolist() == [2.0] * 4
        assert stats.entries == 1
        # Past TTL + stale_s: gone for both lookups.
        clock.now += 15
        assert await cache.lookup_stale(key(1), "m") is None
        assert (stats.entries, stats.bytes, stats.expired) == (0, 0, 2)
        assert stats.hits == 3 and stats.stale_hits == 2  # stale answers are not hits

    asyncio.run(scenario())


def test_without_stale_s_an_entry_past_its_ttl_is_gone_as_before():
    async def scenario():
        clock = Clock()
        cache, model = local_cache(clock), Model()
        await cache.get_or_run(key(1), "m", model.run(1), ttl_s=10)
        clock.now += 10
        assert await cache.lookup_stale(key(1), "m") is None
        stats = cache.stats[0]
        assert (stats.expired, stats.entries, stats.bytes, stats.stale_hits) == (1, 0, 0, 0)
        assert stats.misses == 2  # the first get_or_run's and the stale lookup's

    asyncio.run(scenario())


def test_entries_without_a_ttl_never_go_stale():
    async def scenario():
        clock = Clock()
        cache, model = local_cache(clock), Model()
        await cache.get_or_run(key(1), "m", model.run(1), stale_s=5)
        clock.now += 1e6
        assert (await cache.get_or_run(key(1), "m", model.run(1), stale_s=5))[1] == "local"
        found = await cache.lookup_stale(key(1), "m")
        assert found is not None and not found[1] and model.calls == 1

    asyncio.run(scenario())


def test_kept_entries_count_in_the_bytes_and_go_first_by_lru():
    clock = Clock()
    one = entry(1)[2]
    tier = LocalTier(3 * one, clock)
    tier.put(key(1), "m", entry(1), ttl_s=10, stale_s=100)
    tier.put(key(2), "m", entry(2), ttl_s=10, stale_s=100)
    clock.now += 20  # both stale, still held: they count
    assert (tier.stats.entries, tier.stats.bytes) == (2, 2 * one)
    assert tier.get(key(1), "m") is None  # a normal miss does not refresh its LRU place
    assert tier.lookup(key(2), "m") is not None  # a stale answer does
    tier.put(key(3), "m", entry(3))
    tier.put(key(4), "m", entry(4))  # over the bound: the least recently used goes, 1
    assert tier.lookup(key(1), "m") is None
    assert [tier.lookup(key(n), "m") is not None for n in (2, 3, 4)] == [True] * 3
    assert (tier.stats.entries, tier.stats.bytes, tier.stats.evictions) == (3, 3 * one, 1)
    tier.put(key(2), "m", entry(2), ttl_s=10)  # replacing a kept entry: counted once
    assert (tier.stats.entries, tier.stats.bytes) == (3, 3 * one)
    tier.invalidate_model("m")
    assert (tier.stats.entries, tier.stats.bytes) == (0, 0)


def test_a_kept_entry_still_counts_against_max_entries():
    clock = Clock()
    tier = LocalTier(1 << 20, clock)
    tier.put(key(1), "m", entry(1), ttl_s=1, max_entries=2, stale_s=100)
    clock.now += 5
    tier.put(key(2), "m", entry(2), max_entries=2)
    tier.put(key(3), "m", entry(3), max_entries=2)
    assert tier.lookup(key(1), "m") is None and tier.stats.evictions == 1
    assert tier.bound_of("m") == 2


def test_a_stale_lookup_of_another_requests_entry_is_a_collision_and_a_miss():
    clock = Clock()
    tier = LocalTier(1 << 20, clock)
    tier.put(key(1), "m", entry(1), ttl_s=1, stale_s=100)
    clock.now += 5
    other = type(key(1))(key(1).digest, b"another description")
    assert tier.lookup(other, "m") is None
    assert (tier.stats.collisions, tier.stats.misses, tier.stats.stale_hits) == (1, 1, 0)


def test_stale_hits_are_exported_per_tier():
    async def scenario():
        clock = Clock()
        cache = local_cache(clock)
        await cache.get_or_run(key(1), "m", Model().run(1), ttl_s=1, stale_s=10)
        clock.now += 2
        assert await cache.lookup_stale(key(1), "m") is not None
        families = {f.name: f for f in CacheCollector(cache).collect()}
        (sample,) = families["inferd_cache_stale_hits"].samples
        assert (sample.name, sample.labels, sample.value) == (
            "inferd_cache_stale_hits_total",
            {"tier": "local"},
            1,
        )

    asyncio.run(scenario())
