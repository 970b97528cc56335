"""The Redis tier: shared by every worker process and replica, never on the tail of the
critical path.

- Every lookup is bounded by `timeout_ms` (the socket timeouts and an asyncio deadline over
  the whole call; redis-py's own retries are off, so one call is one try).
- A timeout, connection error or error reply is counted in `errors` (a timeout in
  `lookup_timeouts` too) and is a miss: the request runs the model; after a few in a row the
  lookups' breaker (breaker.py) skips Redis for a while. A corrupt or foreign value is an
  error and a miss too, but Redis answered: it does not trip the breaker (and the miss's
  insert overwrites it).
- With `pool_size` the connections are bounded and a caller waits for a free one (within
  `wait_timeout` and `timeout_ms`); without it the pool opens what concurrency needs.
- Lookups made in one turn of the event loop go out as one MGET (redis_calls.py).
- The tier's `entries` and `bytes` are counted in Redis in the background (redis_usage.py),
  unknown (-1) until a walk of its keys has finished.
- Inserts never delay an answer: they go through a bounded queue (full: dropped, counted)
  to one background task that writes them on a connection of its own in pipelined batches,
  `SET key value PX ttl` (up to 64 values or 256 KiB a batch), each bounded by
  `insert_timeout_ms` plus the values' transfer time at 100 MB/s: background work can wait
  out a busy host's stalls that a lookup must not.
- Lookups and inserts each have a breaker: slow inserts (a failed batch, a timed-out one)
  open the inserts' breaker only, and inserts are then dropped (counted, `breaker_open`)
  while lookups go on; failing lookups open the lookups' breaker only, and inserts go on.
  Each probes Redis on its own after `open_s`. A breaker counts calls of Redis (an MGET
  once, whatever it carried), and calls that fail together, as a stall of this process
  makes them, once (breaker.py).

Keys are `inferd:cache:v1:<hex digest>`; values are redis_encoding.py's compact form, carrying the
key description, compared on every hit. An entry stored with stale_s lives `PX ttl+stale_s`
behind an envelope with its fresh-until time: `get` treats it as expired past that time,
`find(stale_ok=True)` (a degraded model's lookup) answers with it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeAlias

from inferd.cache import redis_encoding as codec
from inferd.cache.breaker import Breaker
from inferd.cache.cache_settings import CacheConfigError, RedisSettings
from inferd.cache.entry import CachedResponse, frozen, make_entry
from inferd.cache.keys import CacheKey
from inferd.cache.redis_calls import LookupBatcher, cancels, reraise_swallowed_cancel
from inferd.cache.redis_usage import RedisUsage
from inferd.cache.tier_stats import TierStats

log = logging.getLogger("inferd.cache")

KEY_PREFIX = "inferd:cache:v1:"
QUEUE_ITEMS = 1024  # pending inserts; past it they are dropped (and counted)
CLOSE_FLUSH_S = 1.0  # how long close() lets queued inserts go out
BATCH_ITEMS = 64  # inserts per pipelined round trip, at most
BATCH_BYTES = 256 * 1024  # and this many bytes of values (a larger value goes alone)
# An insert is background work: bounded by insert_timeout_ms plus its values' transfer at
# this rate (loopback Redis took 7 ms for one 1 MB SET), so a large answer can be stored at
# all instead of timing out and opening the inserts' breaker.
INSERT_BYTES_PER_S = 100e6
LOOKUP, INSERT = "lookup", "insert"  # the operations, each with its breaker
DROP_REASONS = ("queue_full", "breaker_open", "failed", "unencodable")

# An entry with its wall-clock times (None: stored without stale_s) and whether it is stale.
Found: TypeAlias = tuple[CachedResponse, float | None, float | None, bool]


def _redis_asyncio() -> Any:
    try:
        import redis.asyncio
        import redis.asyncio.retry
        import redis.backoff
    except ImportError:
        raise CacheConfigError(
            "--cache-config redis needs the redis client: pip install 'inferd[redis]'"
        ) from None
    return redis


class RedisTier:
    def __init__(
        self,
        settings: RedisSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        queue_items: int = QUEUE_ITEMS,
        key_prefix: str = KEY_PREFIX,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`wall_clock` times stale-retained entries (shared by the replicas: wall time)."""
        self._redis = _redis_asyncio()  # fails at construction, before serving, if missing
        self.settings = settings
        self.timeout_s = settings.timeout_ms / 1000
        self.insert_timeout_s = settings.insert_timeout_ms / 1000
        # One per operation (the module's doc): neither's failures open the other.
        self.breakers = {LOOKUP: Breaker(clock=clock), INSERT: Breaker(clock=clock)}
        self.key_prefix = key_prefix
        self.wall_clock = wall_clock
        self.queue_items = queue_items
        # What is in Redis is shared and expires there: counted there (`usage`), in the
        # background; unknown (-1) until then.
        self.stats = TierStats("redis", bytes=-1, entries=-1)
        self.stats.dropped_by_reason.update(dict.fromkeys(DROP_REASONS, 0))  # series from 0
        self.usage: RedisUsage | None = None
        self._client: Any = None
        self._writer: Any = None  # the inserts' connection (start)
        self._pool: Any = None
        self._lookups: LookupBatcher | None = None
        self._queue: asyncio.Queue[tuple[str, bytes, float | None]] | None = None
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Make the client (it connects on first use) and the insert worker; idempotent.
        Needs the running loop: it is the loop the worker and connections live on."""
        if self._client is not None:
            return
        redis, settings = self._redis, self.settings
        connection = {
            "host": settings.host,
            "port": settings.port,
            "db": settings.db,
            "username": settings.user,
            "password": settings.password,
            "socket_timeout": self._socket_s(settings.socket_timeout_ms),
            "socket_connect_timeout": self._socket_s(settings.connect_timeout_ms),
            "retry": redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
        }
        if settings.pool_size is None:
            self._client = redis.asyncio.Redis(**connection)
        else:  # bounded: callers wait for a free connection (wait_timeout, timeout_ms)
            wait_ms = settings.wait_timeout_ms
            pool = redis.asyncio.BlockingConnectionPool(
                max_connections=settings.pool_size,
                timeout=None if not wait_ms else wait_ms / 1000,
                **connection,
            )
            self._client = redis.asyncio.Redis(connection_pool=pool)
            self._pool = pool  # the client does not close a pool it was given
        # The inserts' own connection (one: one worker writes), bounded by insert_timeout_ms:
        # its connect (unless connect_timeout was set) and its whole call (_insert), not each
        # socket read, unless socket_timeout was set (a large batch's reply may take longer).
        explicit = settings.socket_timeout_ms
        writer = {
            **connection,
            "socket_timeout": self._socket_s(explicit) if explicit else None,
            "socket_connect_timeout": self._socket_s(
                settings.connect_timeout_ms, self.insert_timeout_s
            ),
        }
        self._writer = redis.asyncio.Redis(**writer)
        self._lookups = LookupBatcher(
            self._client,
            self.timeout_s,
            self.lookup_breaker.clock,
            lambda started, exc: self._call_ended(LOOKUP, started, exc),
        )
        # The size walk reads, as lookups do: it rests while their breaker is open.
        self.usage = RedisUsage(
            redis.asyncio.Redis(**writer), self.key_prefix, self.stats, self.lookup_breaker
        )
        self.usage.start()
        self._queue = asyncio.Queue(self.queue_items)
        self._worker = asyncio.create_task(self._insert_loop(), name="inferd-cache-redis")

    async def close(self) -> None:
        if self._queue is not None and self._worker is not None:
            try:
                async with asyncio.timeout(CLOSE_FLUSH_S):
                    await self._queue.join()
            except TimeoutError:
                pass  # dropped: a cache may lose entries, never delay a shutdown long
        if self._lookups is not None:
            await self._lookups.close()
            self._lookups = None
        if self.usage is not None:
            await self.usage.close()
            self.usage = None
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._writer is not None:
            await self._writer.aclose()
            self._writer = None
        if self._pool is not None:
            await self._pool.disconnect()
            self._pool = None

    def _socket_s(self, ms: float | None, default_s: float | None = None) -> float | None:
        """A per-socket timeout: `default_s` (timeout_ms) unless set; 0 lifts it (the call's
        bound stays)."""
        if ms is None:
            return self.timeout_s if default_s is None else default_s
        return None if ms == 0 else ms / 1000

    @property
    def lookup_breaker(self) -> Breaker:
        return self.breakers[LOOKUP]

    @property
    def insert_breaker(self) -> Breaker:
        return self.breakers[INSERT]

    def key_of(self, key: CacheKey) -> str:
        return self.key_prefix + key.digest.hex()

    async def get(self, key: CacheKey, model: str) -> CachedResponse | None:
        """The entry for `key`, or None: a miss, an open breaker, a failure (counted), a
        value answering another description (a collision) or a corrupt one, or an entry
        kept past its TTL for stale lookups (counted `expired`). Never raises."""
        found = await self.find(key, model)
        return None if found is None else found[0]

    async def find(self, key: CacheKey, model: str, stale_ok: bool = False) -> Found | None:
        """`get`, with the entry's times: (entry, fresh_until, keep_until, is_stale), times
        wall-clock (None: stored without stale_s). `stale_ok`: an entry past fresh_until is
        an answer, counted in `stale_hits` instead of `hits`."""
        looked_up = await self._lookup(key, model)
        if looked_up is None:
            return None  # counted
        entry, fresh_until, keep_until = looked_up
        stale = False
        if fresh_until is not None and keep_until is not None:
            now = self.wall_clock()
            stale = now >= fresh_until
            # Past keep_until only if Redis' PX and this clock disagree: never an answer.
            if stale and (not stale_ok or now >= keep_until):
                self.stats.expired += 1
                self.stats.miss(model)
                return None
        if stale:
            self.stats.stale_hits += 1
        else:
            self.stats.hit(model)
        return entry, fresh_until, keep_until, stale

    async def _lookup(
        self, key: CacheKey, model: str
    ) -> tuple[CachedResponse, float | None, float | None] | None:
        """The stored entry and its times; None counted as a miss."""
        self.start()
        breaker = self.lookup_breaker
        if not breaker.allow():
            self.stats.skipped += 1
            self.stats.miss(model)
            return None
        started, before = time.perf_counter(), cancels()
        try:
            assert self._lookups is not None
            value = await self._lookups.get(self.key_of(key))  # bounded: timeout_ms
            reraise_swallowed_cancel(before)
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        except Exception as exc:  # any failure of Redis is a miss, never the request's
            self.stats.lookup_seconds.observe(time.perf_counter() - started)  # timeouts too
            self.stats.errors += 1  # (the MGET told the breaker, once for all it carried)
            if self._timed_out(exc):
                self.stats.lookup_timeouts += 1
            self.stats.miss(model)
            return None
        self.stats.lookup_seconds.observe(time.perf_counter() - started)
        found = None if value is None else self._entry(key, value)
        if found is None:
            self.stats.miss(model)
        return found

    def _entry(
        self, key: CacheKey, value: bytes
    ) -> tuple[CachedResponse, float | None, float | None] | None:
        try:
            value, fresh_until, keep_until = codec.unwrap(value)
            if not codec.answers(value, key.description):
                codec.description_of(value)  # not even ours: CorruptValueError
                self.stats.collisions += 1  # ours, for another request
                return None
            outputs = codec.decode(value)
        except codec.CorruptValueError as exc:
            self.stats.errors += 1
            log.warning("response cache: corrupt Redis value at %s: %s", self.key_of(key), exc)
            return None
        for output in outputs:
            frozen(output[3])
        return make_entry(key.description, tuple(outputs)), fresh_until, keep_until

    def put(
        self, key: CacheKey, entry: CachedResponse, ttl_s: float | None, stale_s: float = 0.0
    ) -> None:
        """Queue the entry for the background insert; never waits. ttl_s None: the tier's
        default TTL (None there too: no expiry). With a TTL, `stale_s` keeps the entry that
        long past it (PX ttl + stale_s), its times in redis_encoding.py's envelope."""
        self.start()
        assert self._queue is not None
        if self.insert_breaker.refusing():  # a probe due goes through: _insert takes it
            self.stats.dropped("breaker_open")
            return
        try:
            value = codec.encode(entry[0], entry[1])
        except codec.UnencodableError:
            self.stats.dropped("unencodable")
            return
        ttl = self.settings.ttl_s if ttl_s is None else ttl_s
        if ttl is not None and stale_s > 0:
            fresh_until = self.wall_clock() + ttl
            value = codec.wrap(value, fresh_until, fresh_until + stale_s)
            ttl += stale_s
        try:
            self._queue.put_nowait((self.key_of(key), value, ttl))
        except asyncio.QueueFull:
            self.stats.dropped("queue_full")

    async def flush(self) -> None:
        """Wait until every queued insert has been tried (tests; a clean shutdown)."""
        if self._queue is not None:
            await self._queue.join()

    async def _insert_loop(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            size = len(batch[0][1])
            while len(batch) < BATCH_ITEMS and not queue.empty() and size < BATCH_BYTES:
                item = queue.get_nowait()
                batch.append(item)
                size += len(item[1])
            try:
                before = cancels()
                await self._insert(batch)
                reraise_swallowed_cancel(before)
            finally:
                for _ in batch:
                    queue.task_done()

    async def _insert(self, batch: list[tuple[str, bytes, float | None]]) -> None:
        breaker = self.insert_breaker
        if not breaker.allow():
            self.stats.dropped("breaker_open", len(batch))
            return
        started, began = time.perf_counter(), breaker.clock()
        bound_s = self.insert_timeout_s + sum(len(v) for _, v, _ in batch) / INSERT_BYTES_PER_S
        try:
            async with asyncio.timeout(bound_s):
                pipe = self._writer.pipeline(transaction=False)
                for name, value, ttl in batch:
                    pipe.set(name, value, px=None if ttl is None else math.ceil(ttl * 1000))
                await pipe.execute()
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        except Exception as exc:
            self.stats.errors += 1
            if self._timed_out(exc):
                self.stats.insert_timeouts += 1
            self.stats.dropped("failed", len(batch))
            self._call_ended(INSERT, began, exc)
            return
        self._call_ended(INSERT, began, None)
        elapsed = time.perf_counter() - started
        for _ in batch:
            self.stats.insert_seconds.observe(elapsed)
        self.stats.inserts += len(batch)

    def _timed_out(self, exc: Exception) -> bool:
        return isinstance(exc, TimeoutError | self._redis.exceptions.TimeoutError)

    def _call_ended(self, operation: str, started: float, exc: Exception | None) -> None:
        """A call of Redis for `operation` ended (`started`: on its breaker's clock): its
        breaker learns the outcome."""
        breaker = self.breakers[operation]
        if exc is None:
            breaker.succeeded()
            return
        was_open = breaker.is_open
        breaker.failed(started)
        if breaker.is_open and not was_open:
            log.warning(
                "response cache: Redis %s:%d %s failed (%s: %s); no %ss for %.0f s",
                self.settings.host,
                self.settings.port,
                operation,
                type(exc).__name__,
                str(exc) or "timed out",
                operation,
                breaker.open_s,
            )
