"""The in-process tier: an LRU bounded by the bytes of its entries (keys + values), with an
optional per-model entry bound and per-entry TTL. Synchronous and lock-free: it runs on the
event loop only, between awaits. Slots are plain tuples, like the entries (entry.py), so the
garbage collector untracks them.

An entry stored with `stale_s` is kept that long past its TTL (fresh-until, keep-until), for
a degraded model's `lookup` (docs/cache.md, "Stale entries"): `get` still treats it as
expired, and it counts against the tier's bytes and LRU order like any other."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeAlias

from inferd.cache.entry import CachedResponse
from inferd.cache.keys import CacheKey
from inferd.cache.tier_stats import TierStats

# (entry, model, fresh_until, keep_until) on the tier's clock, None: no TTL (keep_until is
# fresh_until without stale_s). A plain tuple, untracked by the GC.
_Slot: TypeAlias = tuple[CachedResponse, str, float | None, float | None]


class LocalTier:
    def __init__(self, size_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.size_bytes = size_bytes
        self.clock = clock
        self.stats = TierStats("local")
        self._slots: OrderedDict[bytes, _Slot] = OrderedDict()  # by digest, oldest first
        self._by_model: dict[str, OrderedDict[bytes, None]] = {}  # the same order, per model
        # Each model's cache_max_entries as its last put gave it: a fill from a stale lookup,
        # which knows no options, keeps the model's bound too.
        self._bounds: dict[str, int | None] = {}

    def get(self, key: CacheKey, model: str) -> CachedResponse | None:
        """The fresh entry for `key`, or None (one kept past its TTL, by stale_s, is expired
        here: the miss's run replaces it). The hit path: kept apart from `lookup`'s."""
        started = time.perf_counter()
        slot = self._slots.get(key.digest)
        if slot is not None and slot[2] is not None:
            now = self.clock()
            if now >= slot[2]:
                keep_until = slot[3]
                if keep_until is None or now >= keep_until:
                    self._remove(key.digest)
                self.stats.expired += 1
                slot = None
        if slot is not None and slot[0][0] != key.description:
            self.stats.collisions += 1  # another request's answer: never served
            slot = None
        if slot is None:
            self.stats.miss(model)
        else:
            self._slots.move_to_end(key.digest)
            self._by_model[slot[1]].move_to_end(key.digest)
            self.stats.hit(model)
        self.stats.lookup_seconds.observe(time.perf_counter() - started)
        return None if slot is None else slot[0]

    def lookup(self, key: CacheKey, model: str) -> tuple[CachedResponse, bool] | None:
        """For a degraded model: the entry for `key`, fresh or kept past its TTL, and whether
        it is stale. A stale answer counts in `stale_hits`, not in `hits`."""
        started = time.perf_counter()
        slot = self._slots.get(key.digest)
        stale = False
        fresh_until, keep_until = (None, None) if slot is None else (slot[2], slot[3])
        if fresh_until is not None:
            now = self.clock()
            if keep_until is None or now >= keep_until:
                self._remove(key.digest)
                self.stats.expired += 1
                slot = None
            else:
                stale = now >= fresh_until
        if slot is not None and slot[0][0] != key.description:
            self.stats.collisions += 1
            slot = None
        if slot is None:
            self.stats.miss(model)
        else:
            self._slots.move_to_end(key.digest)
            self._by_model[slot[1]].move_to_end(key.digest)
            if stale:
                self.stats.stale_hits += 1
            else:
                self.stats.hit(model)
        self.stats.lookup_seconds.observe(time.perf_counter() - started)
        return None if slot is None else (slot[0], stale)

    def put(
        self,
        key: CacheKey,
        model: str,
        entry: CachedResponse,
        ttl_s: float | None = None,
        max_entries: int | None = None,
        stale_s: float = 0.0,
    ) -> bool:
        """Store (replacing what the digest held); False when the entry alone is over the
        bound. Evicts least recently used entries, of any model for bytes and of this
        model for `max_entries`. With a TTL, `stale_s` keeps the entry that long past it."""
        fresh_until = None if ttl_s is None else self.clock() + ttl_s
        keep_until = None if fresh_until is None else fresh_until + stale_s
        self._bounds[model] = max_entries
        return self._store(key, model, entry, fresh_until, keep_until, max_entries)

    def put_until(
        self,
        key: CacheKey,
        model: str,
        entry: CachedResponse,
        fresh_until: float,
        keep_until: float,
        max_entries: int | None,
    ) -> bool:
        """Store with the times another tier gave the entry (on this tier's clock)."""
        return self._store(key, model, entry, fresh_until, keep_until, max_entries)

    def bound_of(self, model: str) -> int | None:
        """The model's cache_max_entries as its last `put` gave it (for a stale lookup's
        fill, which knows no options)."""
        return self._bounds.get(model)

    def _store(
        self,
        key: CacheKey,
        model: str,
        entry: CachedResponse,
        fresh_until: float | None,
        keep_until: float | None,
        max_entries: int | None,
    ) -> bool:
        started = time.perf_counter()
        nbytes = entry[2]
        if nbytes > self.size_bytes:
            self.stats.oversize += 1
            return False
        if key.digest in self._slots:
            self._remove(key.digest)
        model_slots = self._by_model.setdefault(model, OrderedDict())
        if max_entries is not None:
            while len(model_slots) >= max_entries:
                self._evict(next(iter(model_slots)))
        while self.stats.bytes + nbytes > self.size_bytes:
            self._evict(next(iter(self._slots)))
        self._slots[key.digest] = (entry, model, fresh_until, keep_until)
        # _evict may have dropped the model's (then empty) index: look it up again.
        self._by_model.setdefault(model, model_slots)[key.digest] = None
        self.stats.bytes += nbytes
        self.stats.entries += 1
        self.stats.inserts += 1
        self.stats.insert_seconds.observe(time.perf_counter() - started)
        return True

    def invalidate_model(self, model: str) -> None:
        for digest in list(self._by_model.get(model, ())):
            self._remove(digest)
        self._bounds.pop(model, None)

    def _evict(self, digest: bytes) -> None:
        self._remove(digest)
        self.stats.evictions += 1

    def _remove(self, digest: bytes) -> None:
        entry, model, _, _ = self._slots.pop(digest)
        model_slots = self._by_model[model]
        del model_slots[digest]
        if not model_slots:
            del self._by_model[model]
        self.stats.bytes -= entry[2]
        self.stats.entries -= 1
