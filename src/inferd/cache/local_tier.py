"""The in-process tier: an LRU bounded by the bytes of its entries (keys + values), with an
optional per-model entry bound and per-entry TTL. Synchronous and lock-free: it runs on the
event loop only, between awaits. Slots are plain tuples, like the entries (entry.py), so the
garbage collector untracks them."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeAlias

from inferd.cache.entry import CachedResponse
from inferd.cache.keys import CacheKey
from inferd.cache.stats import TierStats

# (entry, model, expires_at on the tier's clock or None): a plain tuple, untracked by the GC
_Slot: TypeAlias = tuple[CachedResponse, str, float | None]


class LocalTier:
    def __init__(self, size_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.size_bytes = size_bytes
        self.clock = clock
        self.stats = TierStats("local")
        self._slots: OrderedDict[bytes, _Slot] = OrderedDict()  # by digest, oldest first
        self._by_model: dict[str, OrderedDict[bytes, None]] = {}  # the same order, per model

    def get(self, key: CacheKey, model: str) -> CachedResponse | None:
        started = time.perf_counter()
        slot = self._slots.get(key.digest)
        if slot is not None and slot[2] is not None and self.clock() >= slot[2]:
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

    def put(
        self,
        key: CacheKey,
        model: str,
        entry: CachedResponse,
        ttl_s: float | None = None,
        max_entries: int | None = None,
    ) -> bool:
        """Store (replacing what the digest held); False when the entry alone is over the
        bound. Evicts least recently used entries, of any model for bytes and of this
        model for `max_entries`."""
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
        expires_at = None if ttl_s is None else self.clock() + ttl_s
        self._slots[key.digest] = (entry, model, expires_at)
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

    def _evict(self, digest: bytes) -> None:
        self._remove(digest)
        self.stats.evictions += 1

    def _remove(self, digest: bytes) -> None:
        entry, model, _ = self._slots.pop(digest)
        model_slots = self._by_model[model]
        del model_slots[digest]
        if not model_slots:
            del self._by_model[model]
        self.stats.bytes -= entry[2]
        self.stats.entries -= 1
