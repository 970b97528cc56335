"""No stampede: concurrent identical misses run the model once, share its result or its
error, and a cancelled first caller leaves nobody hanging."""

from __future__ import annotations

import asyncio

import pytest

from inferd.cache import CacheSettings, LocalSettings, ResponseCache
from tests.support.cache_helpers import Model, key, outputs, wait_for

CALLERS = 64


def local_cache() -> ResponseCache:
    return ResponseCache(CacheSettings(local=LocalSettings(1 << 20)))


def test_64_identical_concurrent_misses_run_once():
    async def scenario():
        cache, model = local_cache(), Model()
        model.gate.clear()
        tasks = [
            asyncio.create_task(cache.get_or_run(key(1), "m", model.run(1))) for _ in range(CALLERS)
        ]
        await wait_for(lambda: cache.coalesced == CALLERS - 1)
        model.gate.set()
        results = await asyncio.gather(*tasks)
        assert model.calls == 1
        assert all(r[0][0].data.tolist() == [1.0] * 4 and r[1] == "" for r in results)
        assert cache.stats[0].misses == CALLERS and cache.stats[0].inserts == 1
        assert (await cache.get_or_run(key(1), "m", model.run(1)))[1] == "local"

    asyncio.run(scenario())


def test_without_any_tier_the_flight_still_runs_once():
    async def scenario():
        cache, model = ResponseCache(CacheSettings()), Model()
        model.gate.clear()
        tasks = [asyncio.create_task(cache.get_or_run(key(1), "m", model.run(1))) for _ in range(8)]
        await wait_for(lambda: cache.coalesced == 7)
        model.gate.set()
        await asyncio.gather(*tasks)
        assert model.calls == 1 and cache.stats == []

    asyncio.run(scenario())


def test_a_failure_reaches_every_waiter_and_nothing_is_cached():
    async def scenario():
        cache, model = local_cache(), Model(fail=RuntimeError("model broke"))
        model.gate.clear()
        tasks = [
            asyncio.create_task(cache.get_or_run(key(1), "m", model.run(1))) for _ in range(CALLERS)
        ]
        await wait_for(lambda: cache.coalesced == CALLERS - 1)
        model.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert model.calls == 1
        assert all(isinstance(r, RuntimeError) and str(r) == "model broke" for r in results)
        assert cache.stats[0].entries == 0
        model.fail = None
        assert (await cache.get_or_run(key(1), "m", model.run(1)))[1] == ""
        assert model.calls == 2

    asyncio.run(scenario())


def test_a_cancelled_first_caller_does_not_leave_the_others_hanging():
    async def scenario():
        cache, model = local_cache(), Model()
        model.gate.clear()
        first = asyncio.create_task(cache.get_or_run(key(1), "m", model.run(1)))
        await wait_for(model.started.is_set)
        others = [
            asyncio.create_task(cache.get_or_run(key(1), "m", model.run(1))) for _ in range(3)
        ]
        await wait_for(lambda: cache.coalesced == 3)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        model.gate.set()
        results = await asyncio.gather(*others)
        assert [r[0][0].data[0] for r in results] == [1.0] * 3
        # The cancelled call's run ended with it; one waiter ran the model again, once.
        assert model.calls == 2 and cache.stats[0].entries == 1

    asyncio.run(scenario())


def test_when_every_caller_is_cancelled_the_run_is_cancelled_and_a_new_one_starts():
    async def scenario():
        cache, model = local_cache(), Model()
        model.gate.clear()
        callers = [
            asyncio.create_task(cache.get_or_run(key(1), "m", model.run(1))) for _ in range(2)
        ]
        await wait_for(lambda: model.started.is_set() and cache.coalesced == 1)
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        model.gate.set()
        got, source = await cache.get_or_run(key(1), "m", model.run(1))
        assert source == "" and got[0].data[0] == 1.0
        assert model.calls == 2 and cache.stats[0].entries == 1

    asyncio.run(scenario())


def test_an_oversize_answer_is_copied_only_for_waiters():
    """Not cached either way; the lone caller gets run()'s own arrays (no copy for nothing),
    while waiters get copies: run()'s buffers belong to the caller that ran it."""

    async def scenario():
        cache = local_cache()
        mine = outputs(1, size=100)

        async def run():
            return mine

        got, _ = await cache.get_or_run(key(1), "m", run, max_response_bytes=10)
        assert got[0].data is mine[0].data

        gate = asyncio.Event()

        async def held():
            await gate.wait()
            return mine

        tasks = [
            asyncio.create_task(cache.get_or_run(key(2), "m", held, max_response_bytes=10))
            for _ in range(3)
        ]
        await wait_for(lambda: cache.coalesced == 2)
        gate.set()
        for got, source in await asyncio.gather(*tasks):
            assert source == "" and got[0].data is not mine[0].data
            assert got[0].data.tolist() == [1.0] * 100 and not got[0].data.flags.writeable
        assert cache.stats[0].entries == 0 and cache.stats[0].oversize == 2

    asyncio.run(scenario())
