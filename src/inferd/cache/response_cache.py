"""The response cache the front ends call: a local LRU in front of an optional Redis shared
by every process and replica, with single flight for concurrent identical misses.

    get_or_run(key, model, run) -> (outputs, source)
      1. local tier           hit: "local" (no await: the cheap path)
      2. lead or join the key's flight (single_flight.py); the leader, inline:
         a. Redis tier        hit: fills local, "redis"   (bounded by timeout_ms; any failure
                              is counted, skipped by the breaker, and is just a miss)
         b. run()             the model: stored locally at once, queued for Redis, ""

    lookup_stale(key, model) -> (outputs, is_stale) | None
      a degraded model's lookup: local, then Redis, fresh or kept past its TTL (stale_s);
      no flight, never runs the model.

Every caller of a flight gets its source: "" means no tier had the answer (the model ran,
for this caller or for the identical request it waited on: counted, per model, in
`coalesced_by_model`).

One ResponseCache per process and event loop: the tiers and flights are used from that
loop only, without locks (Redis connections and the insert worker belong to it). Reading
`stats` from another thread (a metrics scrape) is safe for the counters; copy the dicts
with dict(...) before iterating them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from inferd.cache.cache_settings import CacheSettings
from inferd.cache.entry import (
    CachedResponse,
    handed_out,
    make_entry,
    owned_copy,
    passed_through,
    response_bytes,
)
from inferd.cache.keys import CacheKey
from inferd.cache.local_tier import LocalTier
from inferd.cache.single_flight import LeaderCancelledError, SingleFlight
from inferd.cache.tier_stats import TierStats
from inferd.events import Gone, forget_keys
from inferd.types import Tensor

if TYPE_CHECKING:
    from inferd.cache.redis_tier import RedisTier

Run = Callable[[], Awaitable[list[Tensor]]]


class ResponseCache:
    def __init__(
        self,
        settings: CacheSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        redis_key_prefix: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` (monotonic seconds) times TTLs and the Redis breaker: tests inject one.
        `redis_key_prefix` (default `inferd:cache:v1:`) keeps deployments sharing one Redis
        apart. `wall_clock` times the Redis entries kept past their TTL (stale_s): replicas
        share it. CacheConfigError at once if Redis is configured without the redis
        package."""
        self.settings = settings
        self.clock = clock
        self.wall_clock = wall_clock
        self.local = LocalTier(settings.local.size_bytes, clock) if settings.local else None
        self.redis: RedisTier | None = None
        if settings.redis is not None:
            from inferd.cache.redis_tier import KEY_PREFIX, RedisTier  # needs the redis extra

            self.redis = RedisTier(
                settings.redis,
                clock=clock,
                key_prefix=redis_key_prefix or KEY_PREFIX,
                wall_clock=wall_clock,
            )
        self._flights: SingleFlight[tuple[CachedResponse, str]] = SingleFlight()
        # Per model: callers answered by an identical caller's run (they waited for it).
        self.coalesced_by_model: dict[str, int] = {}

    async def start(self) -> None:
        """Start the Redis tier's insert worker; connects lazily, never fails if it is down."""
        if self.redis is not None:
            self.redis.start()

    async def close(self) -> None:
        """Give queued Redis inserts a moment (bounded), then stop."""
        if self.redis is not None:
            await self.redis.close()

    async def flush(self) -> None:
        """Wait until every queued Redis insert has been tried (tests, shutdown)."""
        if self.redis is not None:
            await self.redis.flush()

    async def get_or_run(
        self,
        key: CacheKey,
        model: str,
        run: Run,
        ttl_s: float | None = None,
        max_entries: int | None = None,
        max_response_bytes: int | None = None,
        stale_s: float = 0.0,
    ) -> tuple[list[Tensor], str]:
        """The outputs (read-only arrays the cache owns: safe to keep; or, for a response
        over max_response_bytes that nobody else waited for, run()'s own) and where they
        came from: "local", "redis", or "" (no tier had them). run()'s exception reaches
        every caller of the flight, and nothing is cached then.

        `ttl_s` (the model's cache_ttl_seconds) is the entries' TTL in both tiers; without
        it the Redis tier's `ttl` is, in the local tier as well (a local copy then lives at
        most that long after it was stored or read from Redis); with neither, entries stay
        until evicted (Redis: until its own maxmemory policy removes them).

        `stale_s`: entries with a TTL are kept that much longer, for `lookup_stale` only;
        here an entry past its TTL is a miss (counted `expired`) whose run replaces it."""
        if self.local is not None:
            found = self.local.get(key, model)
            if found is not None:
                return handed_out(found), "local"
        ttl = ttl_s if ttl_s is not None or self.redis is None else self.redis.settings.ttl_s

        led = False

        async def fill() -> tuple[CachedResponse, str]:
            nonlocal led
            led = True
            return await self._fill(key, model, run, ttl, max_entries, max_response_bytes, stale_s)

        while True:
            try:
                entry, source = await self._flights.run(key, fill)
            except LeaderCancelledError:
                # The identical request we waited on was cancelled: another waiter may
                # have stored the answer since; if not, lead or wait once more.
                if self.local is not None:
                    found = self.local.get(key, model)
                    if found is not None:
                        return handed_out(found), "local"
                continue
            if not led and not source:  # answered by the identical caller's run
                counts = self.coalesced_by_model
                counts[model] = counts.get(model, 0) + 1
            return handed_out(entry), source

    async def _fill(
        self,
        key: CacheKey,
        model: str,
        run: Run,
        ttl_s: float | None,
        max_entries: int | None,
        max_response_bytes: int | None,
        stale_s: float,
    ) -> tuple[CachedResponse, str]:
        if self.redis is not None:
            found = await self.redis.find(key, model)
            if found is not None:
                entry, fresh_until, keep_until, _ = found
                if self.local is not None:
                    if fresh_until is None or keep_until is None:
                        self.local.put(key, model, entry, ttl_s, max_entries, stale_s)
                    else:  # the local copy ages with the Redis entry, not afresh
                        self._fill_local(key, model, entry, (fresh_until, keep_until), max_entries)
                return entry, "redis"
        outputs = await run()
        if any(t.shared_memory is not None for t in outputs):
            # Written into the client's region, not held by the response: nothing to keep.
            return (key.description, passed_through(outputs), 0), ""
        # The entry's size: the answer and the key description it carries (which holds the
        # inputs' bytes: a large request with a small answer is a large entry too).
        size = len(key.description) + response_bytes(outputs)
        if max_response_bytes is not None and size > max_response_bytes:
            for stats in self.stats:
                stats.oversize += 1
            if not self._flights.joined(key):  # the caller's own outputs, uncopied
                return (key.description, passed_through(outputs), 0), ""
            # Waiters get copies: run()'s buffers are the caller's (it may reuse them).
            return (key.description, owned_copy(outputs), 0), ""
        entry = make_entry(key.description, owned_copy(outputs))
        if self.local is not None:
            self.local.put(key, model, entry, ttl_s, max_entries, stale_s)
        if self.redis is not None:
            self.redis.put(key, entry, ttl_s, stale_s)
        return entry, ""

    async def lookup_stale(self, key: CacheKey, model: str) -> tuple[list[Tensor], bool] | None:
        """For a degraded model (docs/cache.md, "Stale entries"): the entry answering `key`,
        fresh or kept past its TTL by stale_s, and whether it is stale; None if no tier has
        one. Local first, then Redis (bounded like any lookup: timeout_ms, the breaker).
        Never runs the model, joins no flight. A fresh answer counts as the tier's hit, a
        stale one in `stale_hits` only, None as a miss of each tier asked."""
        if self.local is not None:
            local = self.local.lookup(key, model)
            if local is not None:
                return handed_out(local[0]), local[1]
        if self.redis is None:
            return None
        found = await self.redis.find(key, model, stale_ok=True)
        if found is None:
            return None
        entry, fresh_until, keep_until, stale = found
        # Without times (stored without stale_s) its TTL is unknown here: not copied.
        if self.local is not None and fresh_until is not None and keep_until is not None:
            bound = self.local.bound_of(model)
            self._fill_local(key, model, entry, (fresh_until, keep_until), bound)
        return handed_out(entry), stale

    def _fill_local(
        self,
        key: CacheKey,
        model: str,
        entry: CachedResponse,
        until: tuple[float, float],
        max_entries: int | None,
    ) -> None:
        """A Redis entry stored with its times (wall clock: fresh-until, keep-until), copied
        into the local tier with them moved onto its clock (monotonic)."""
        assert self.local is not None
        shift = self.clock() - self.wall_clock()
        fresh_until, keep_until = until[0] + shift, until[1] + shift
        self.local.put_until(key, model, entry, fresh_until, keep_until, max_entries)

    def forget(self, gone: Gone) -> None:
        """The per-model counts of models that are gone (unloaded, or out of the
        repository): their series go with them."""
        for stats in self.stats:
            forget_keys(stats.hits_by_model, gone, per_model=True)
            forget_keys(stats.misses_by_model, gone, per_model=True)
        forget_keys(self.coalesced_by_model, gone, per_model=True)

    def invalidate_model(self, model: str) -> None:
        """Drop the model's local entries (unload, version swap: keys hold the version, so
        this is hygiene, not correctness). Redis entries age out by their TTL."""
        if self.local is not None:
            self.local.invalidate_model(model)

    @property
    def coalesced(self) -> int:
        """Callers that joined an identical request's flight instead of starting one (its
        run or its Redis lookup; `coalesced_by_model` counts those answered by a run)."""
        return self._flights.coalesced

    @property
    def stats(self) -> list[TierStats]:
        """One per configured tier, "local" first."""
        tiers: list[TierStats] = []
        if self.local is not None:
            tiers.append(self.local.stats)
        if self.redis is not None:
            tiers.append(self.redis.stats)
        return tiers
