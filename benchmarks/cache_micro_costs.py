"""What the cache core costs in process, for the example MLP's request (FP32 [1, 64] in;
FP32 [1, 16] and INT64 [1, 1] out, both requested with binary_data): not a test, a
measurement, printed. `--redis` adds the Redis tier (the machine's Redis at 127.0.0.1:6379,
keys under a prefix of their own, deleted after).

    .venv/bin/python benchmarks/cache_micro_costs.py [--redis]

- cache_key: one key.
- hit: get_or_run of a key the local tier holds (the Redis-only line: a Redis round trip);
  then 64 concurrent hits of different keys (Redis: one MGET for the 64).
- miss overhead: get_or_run of fresh keys with a run() that answers at once, less run().
- GC: objects the collector tracks after 100,000 entries, and one full collection's time
  with them (and with none, the baseline).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import uuid

import numpy as np

from inferd.cache import CacheSettings, LocalSettings, RedisSettings, ResponseCache, cache_key
from inferd.types import RequestedOutput, Tensor

CALLS = 20_000
ENTRIES = 100_000

INPUT = Tensor("input", "FP32", (1, 64), np.random.rand(1, 64).astype(np.float32))
OUTPUTS = [
    Tensor("probabilities", "FP32", (1, 16), np.random.rand(1, 16).astype(np.float32)),
    Tensor("label", "INT64", (1, 1), np.array([[3]], np.int64)),
]
REQUESTED = [RequestedOutput(t.name, {"binary_data": True}) for t in OUTPUTS]


def row(i: int) -> Tensor:
    return Tensor("input", "FP32", (1, 64), np.full((1, 64), i, np.float32))


async def run() -> list[Tensor]:
    return OUTPUTS


def per_call_us(started: float, calls: int) -> float:
    return (time.perf_counter() - started) / calls * 1e6


async def hit_and_miss(settings: CacheSettings, label: str, prefix: str | None = None) -> None:
    cache = ResponseCache(settings, redis_key_prefix=prefix)
    key = cache_key("mlp", "1", [INPUT], REQUESTED, {})
    await cache.get_or_run(key, "mlp", run)
    await cache.flush()
    started = time.perf_counter()
    for _ in range(CALLS):
        await cache.get_or_run(key, "mlp", run)
    hit = per_call_us(started, CALLS)
    fresh = [cache_key("mlp", "1", [row(i)], REQUESTED, {}) for i in range(2000)]
    started = time.perf_counter()
    for k in fresh:
        await cache.get_or_run(k, "mlp", run)
    miss = per_call_us(started, len(fresh))
    started = time.perf_counter()
    for _ in fresh:
        await run()
    bare = per_call_us(started, len(fresh))
    print(f"{label}: hit {hit:.1f} us, miss overhead {miss - bare:.1f} us")
    # 64 concurrent hits of 64 different entries (fresh[:64], stored above), many times:
    await cache.flush()
    rounds = CALLS // 64
    started = time.perf_counter()
    for _ in range(rounds):
        await asyncio.gather(*(cache.get_or_run(k, "mlp", run) for k in fresh[:64]))
    print(f"{label}: 64 concurrent hits {per_call_us(started, rounds * 64):.1f} us each")
    await cache.flush()
    await cache.close()


async def gc_cost(entries: int) -> None:
    cache = ResponseCache(CacheSettings(local=LocalSettings(1 << 30)))
    gc.collect()
    before = len(gc.get_objects())
    for i in range(entries):
        await cache.get_or_run(cache_key("mlp", "1", [row(i)], None, {}), "mlp", run)
    for _ in range(5):  # the collector untracks one level of nested tuples per pass
        gc.collect()
    started = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - started) * 1000
    tracked = len(gc.get_objects()) - before
    print(f"GC with {entries:,} entries: {tracked:+,} tracked objects, full pass {full_ms:.1f} ms")


def main() -> None:
    started = time.perf_counter()
    for _ in range(CALLS):
        cache_key("mlp", "1", [INPUT], REQUESTED, {})
    print(f"cache_key: {per_call_us(started, CALLS):.1f} us")
    asyncio.run(hit_and_miss(CacheSettings(local=LocalSettings(64 << 20)), "local"))
    if "--redis" in sys.argv:
        prefix = f"inferd:micro-costs:{uuid.uuid4().hex}:"
        settings = CacheSettings(redis=RedisSettings("127.0.0.1", timeout_ms=1000))
        asyncio.run(hit_and_miss(settings, "redis only", prefix))
        import redis

        client = redis.Redis("127.0.0.1")
        stale = list(client.scan_iter(match=prefix + "*"))
        if stale:
            client.delete(*stale)
    asyncio.run(gc_cost(0))
    asyncio.run(gc_cost(ENTRIES))


if __name__ == "__main__":
    main()
