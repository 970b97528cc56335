"""The local tier: an LRU bounded by bytes, per-model entry bounds, TTLs on an injected
clock, oversize responses not kept, and arrays the caller can neither change nor alias."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd.cache import CacheKey, CacheSettings, LocalSettings, ResponseCache
from inferd.cache.entry import make_entry, owned_copy
from inferd.cache.local_tier import LocalTier
from tests.support.cache_helpers import Model, key, outputs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(n: float, size: int = 4, model: str = "m"):
    return make_entry(key(n, model).description, owned_copy(outputs(n, size)))


def test_evicts_least_recently_used_by_bytes_and_counts():
    one = entry(1)[2]
    tier = LocalTier(3 * one)
    for n in (1, 2, 3):
        assert tier.put(key(n), "m", entry(n))
    assert tier.get(key(1), "m") is not None  # 1 is now the most recent: 2 goes first
    tier.put(key(4), "m", entry(4))
    assert tier.get(key(2), "m") is None
    assert all(tier.get(key(n), "m") is not None for n in (1, 3, 4))
    assert (tier.stats.evictions, tier.stats.entries, tier.stats.bytes) == (1, 3, 3 * one)


def test_the_bytes_bound_holds_whatever_the_sizes():
    tier = LocalTier(10_000)
    sizes = [1, 500, 30, 2000, 7, 900, 1200, 5, 2400, 60] * 5
    for i, size in enumerate(sizes):
        tier.put(key(i), "m", entry(i, size))
        assert tier.stats.bytes <= 10_000
    kept = [i for i in range(len(sizes)) if tier.get(key(i), "m") is not None]
    assert tier.stats.bytes == sum(entry(i, sizes[i])[2] for i in kept)
    assert tier.stats.entries == len(kept)
    assert tier.stats.evictions == len(sizes) - len(kept)


def test_an_entry_bigger_than_the_tier_is_not_kept():
    tier = LocalTier(entry(1)[2] - 1)
    assert not tier.put(key(1), "m", entry(1))
    assert (tier.stats.entries, tier.stats.oversize, tier.stats.evictions) == (0, 1, 0)


def test_max_entries_bounds_one_model_and_spares_the_others():
    tier = LocalTier(1 << 20)
    tier.put(key(0, "other"), "other", entry(0, model="other"))
    for n in (1, 2, 3):
        tier.put(key(n), "m", entry(n), max_entries=2)
    assert tier.get(key(1), "m") is None
    assert tier.get(key(2), "m") is not None and tier.get(key(3), "m") is not None
    assert tier.get(key(0, "other"), "other") is not None
    assert tier.stats.evictions == 1


def test_ttl_expires_on_the_clock():
    clock = Clock()
    tier = LocalTier(1 << 20, clock)
    tier.put(key(1), "m", entry(1), ttl_s=10)
    tier.put(key(2), "m", entry(2))  # no TTL: kept
    clock.now += 9.9
    assert tier.get(key(1), "m") is not None
    clock.now += 0.1
    assert tier.get(key(1), "m") is None
    assert tier.get(key(2), "m") is not None
    assert (tier.stats.expired, tier.stats.entries) == (1, 1)


def test_invalidate_model_drops_only_that_model():
    tier = LocalTier(1 << 20)
    tier.put(key(1), "m", entry(1))
    tier.put(key(1, "n"), "n", entry(1, model="n"))
    tier.invalidate_model("m")
    assert tier.get(key(1), "m") is None
    assert tier.get(key(1, "n"), "n") is not None
    assert tier.stats.entries == 1 and tier.stats.bytes == entry(1)[2]


def test_a_hit_and_a_miss_are_counted_per_model_with_latencies():
    tier = LocalTier(1 << 20)
    tier.put(key(1), "m", entry(1))
    tier.get(key(1), "m")
    tier.get(key(2), "m")
    tier.get(key(2, "n"), "n")
    assert (tier.stats.hits, tier.stats.misses) == (1, 2)
    assert tier.stats.hits_by_model == {"m": 1}
    assert tier.stats.misses_by_model == {"m": 1, "n": 1}
    assert tier.stats.lookup_seconds.count == 3
    assert sum(tier.stats.lookup_seconds.counts) == 3


def local_cache(size: int = 1 << 20, **kwargs) -> ResponseCache:
    return ResponseCache(CacheSettings(local=LocalSettings(size)), **kwargs)


def test_hit_after_miss_and_the_arrays_are_the_caches_own():
    async def scenario():
        cache, model = local_cache(), Model()
        mine = outputs(7)

        async def run():
            model.calls += 1
            return mine

        first, source = await cache.get_or_run(key(7), "m", run)
        assert source == "" and model.calls == 1
        mine[0].data[:] = -1  # the caller reuses its buffer: the cache kept a copy
        second, source = await cache.get_or_run(key(7), "m", run)
        assert source == "local" and model.calls == 1
        for got in (first, second):
            assert got[0].data.tolist() == [7.0] * 4
            assert not got[0].data.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                got[0].data[0] = 0
        second[0].parameters["x"] = 1  # a caller's tensor fields are its own
        third, _ = await cache.get_or_run(key(7), "m", run)
        assert third[0].parameters == {}

    asyncio.run(scenario())


def test_responses_over_max_response_bytes_are_not_cached():
    async def scenario():
        cache, model = local_cache(), Model()
        for _ in range(2):
            got, source = await cache.get_or_run(
                key(1), "m", model.run(1, size=100), max_response_bytes=399
            )
            assert source == "" and got[0].data.tolist() == [1.0] * 100
        assert model.calls == 2
        assert cache.stats[0].oversize == 2 and cache.stats[0].entries == 0
        await cache.get_or_run(key(1), "m", model.run(1, size=100), max_response_bytes=10_000)
        assert cache.stats[0].entries == 1

    asyncio.run(scenario())


def test_a_digest_collision_never_serves_the_other_answer():
    async def scenario():
        cache, model = local_cache(), Model()
        digest = b"\x01" * 16
        a, b = CacheKey(digest, b"request a"), CacheKey(digest, b"request b")
        assert (await cache.get_or_run(a, "m", model.run(1)))[1] == ""
        got, source = await cache.get_or_run(b, "m", model.run(2))
        assert source == "" and got[0].data.tolist() == [2.0] * 4
        assert model.calls == 2 and cache.stats[0].collisions == 1
        # Concurrent ones do not share a flight either.
        model.gate.clear()
        c, d = CacheKey(b"\x02" * 16, b"c"), CacheKey(b"\x02" * 16, b"d")
        tasks = [
            asyncio.create_task(cache.get_or_run(k, "m", model.run(n))) for k, n in ((c, 3), (d, 4))
        ]
        await asyncio.sleep(0)
        model.gate.set()
        results = await asyncio.gather(*tasks)
        assert [r[0][0].data[0] for r in results] == [3.0, 4.0]
        assert model.calls == 4 and cache.coalesced == 0

    asyncio.run(scenario())


def test_per_model_ttl_applies_through_get_or_run():
    async def scenario():
        clock = Clock()
        cache, model = local_cache(clock=clock), Model()
        await cache.get_or_run(key(1), "m", model.run(1), ttl_s=5)
        clock.now += 4
        assert (await cache.get_or_run(key(1), "m", model.run(1), ttl_s=5))[1] == "local"
        clock.now += 1
        assert (await cache.get_or_run(key(1), "m", model.run(1), ttl_s=5))[1] == ""
        assert model.calls == 2

    asyncio.run(scenario())


def test_outputs_written_to_shared_memory_are_not_cached():
    async def scenario():
        from inferd.types import SharedMemoryRef, Tensor

        cache = local_cache()

        async def run():
            return [
                Tensor(
                    "y",
                    "FP32",
                    (1,),
                    np.zeros(0, np.float32),
                    shared_memory=SharedMemoryRef("r", 4),
                )
            ]

        for _ in range(2):
            assert (await cache.get_or_run(key(1), "m", run))[1] == ""
        assert cache.stats[0].entries == 0

    asyncio.run(scenario())


def test_entries_are_untracked_by_the_garbage_collector():
    """A full collection must not walk the tier's entries (thousands a second with unique
    inputs): plain tuples of bytes, strings, ints and arrays, which CPython untracks."""
    import gc

    tier = LocalTier(1 << 20)
    for n in range(100):
        tier.put(key(n), "m", entry(n))
    for _ in range(5):  # CPython untracks one level of nested tuples per collection
        gc.collect()
    slots = list(tier._slots.values())
    assert len(slots) == 100
    assert not any(gc.is_tracked(slot) for slot in slots)
    assert not any(gc.is_tracked(slot[0]) or gc.is_tracked(slot[0][1]) for slot in slots)


class ReferenceLru:
    """The tier's contract, written the slow and obvious way."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: list[tuple[int, str, int]] = []  # (key, model, bytes), oldest first
        self.evictions = 0

    def get(self, n: int) -> bool:
        for i, item in enumerate(self.order):
            if item[0] == n:
                self.order.append(self.order.pop(i))
                return True
        return False

    def put(self, n: int, model: str, nbytes: int, max_entries: int | None) -> None:
        if nbytes > self.size:
            return
        self.order = [item for item in self.order if item[0] != n]
        if max_entries is not None:
            while sum(1 for item in self.order if item[1] == model) >= max_entries:
                oldest = next(i for i, item in enumerate(self.order) if item[1] == model)
                self.order.pop(oldest)
                self.evictions += 1
        while sum(item[2] for item in self.order) + nbytes > self.size:
            self.order.pop(0)
            self.evictions += 1
        self.order.append((n, model, nbytes))


operations = st.lists(
    st.tuples(
        st.sampled_from(["get", "put"]),
        st.integers(0, 12),  # the key
        st.integers(1, 300),  # output elements: entries of different sizes
        st.sampled_from([None, 2, 3]),  # max_entries
    ),
    max_size=60,
)


@given(operations)
def test_the_tier_behaves_as_a_reference_lru_by_bytes(ops):
    size = 3000
    tier, reference = LocalTier(size), ReferenceLru(size)
    sizes: dict[int, int] = {}
    for op, n, elements, max_entries in ops:
        model = "m" if n % 2 else "n"  # two models, so per-model bounds spare the other
        if op == "get":
            got = tier.get(key(n, model), model)
            assert (got is not None) == reference.get(n)
            if got is not None:
                assert got[1][0][3].tolist() == [float(n)] * sizes[n]
        else:
            item = entry(n, elements, model)
            sizes[n] = elements
            tier.put(key(n, model), model, item, max_entries=max_entries)
            reference.put(n, model, item[2], max_entries)
        assert tier.stats.bytes == sum(item[2] for item in reference.order) <= size
        assert tier.stats.entries == len(reference.order)
        assert tier.stats.evictions == reference.evictions
