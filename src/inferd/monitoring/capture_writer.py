"""The capture writers: background threads that store sampled requests, in batches.

The event loop only offers (`CaptureQueue.offer`: a bounded queue, put without waiting);
when the queue is full, or holds more bytes than it may, the capture is dropped and
counted, and the request never notices. The thread fingerprints each request and gathers
them into batches of about `batch_bytes` (or two seconds' worth), which a subclass stores:
`CaptureWriter` as a shard in `--capture-dir` (capture_files.py), keeping the shards under
`--capture-max-mib` by removing the oldest; `RedisCaptureWriter` (capture_redis.py) as
entries of a capped Redis stream. A store that fails (a full disk, a directory it may not
write, a lost connection) drops that batch, counted by its reason, logged at most once a
minute; the next batch tries again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import orjson

from inferd.events import Gone, forget_keys
from inferd.monitoring.capture_files import (
    CapturedRequest,
    shard_arrays,
    shards,
    write_shard,
)
from inferd.monitoring.capture_settings import CaptureSettings
from inferd.telemetry.request_log import input_fingerprint
from inferd.telemetry.writer_thread import Flush, WriterThread

log = logging.getLogger("inferd.capture")

QUEUE_ITEMS = 4096
QUEUE_BYTES = 256 * 1024 * 1024
FLUSH_AFTER_S = 2.0  # a shard not yet full is written once its oldest capture is this old
POLL_S = 0.25  # how often the writer looks at the queue when nobody wakes it
WARN_EVERY_S = 60.0


class DropCounts:
    """Captures not stored, by (model, reason): counted on the loop and on the writer
    thread, so under a lock (drops are rare; the lock is never held for long)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, model: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(model, reason)] = self._counts.get((model, reason), 0) + n

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def forget(self, gone: Gone) -> None:
        """The counts of models that are gone (unloaded, or out of the repository)."""
        with self._lock:
            forget_keys(self._counts, gone, per_model=True)


class CaptureQueue(WriterThread[CapturedRequest]):
    """The bounded queue and the thread that drains it in batches; a subclass says how a
    batch is stored (`store`) and what a failed store's drops are called (`error_reason`)."""

    error_reason = "write_error"
    thread_name = "inferd-capture"

    def __init__(
        self,
        drops: DropCounts,
        batch_bytes: int,
        max_item_bytes: int | None = None,
        queue_items: int = QUEUE_ITEMS,
    ) -> None:
        self.drops = drops
        self.batch_bytes = batch_bytes
        self.max_item_bytes = max_item_bytes  # None: no single capture is too large
        self.queue_items = queue_items
        # The writer polls, or is woken once a batch is full.
        super().__init__(self.thread_name, "its pending captures are lost")
        self._queued = (0, 0)  # (captures, bytes) offered and not yet taken
        self._lock = threading.Lock()
        self._warned_at = -WARN_EVERY_S

    def store(self, requests: list[CapturedRequest]) -> None:
        """Store one batch, on the thread; an exception drops it (counted, logged)."""
        raise NotImplementedError

    # -- the event loop's side -----------------------------------------------------------

    def offer(self, request: CapturedRequest) -> None:
        """Queue a capture, never waiting: dropped and counted when the writer is behind."""
        nbytes = request.nbytes
        if self.max_item_bytes is not None and nbytes > self.max_item_bytes:
            self.drops.add(request.model, "too_large")
            return
        with self._lock:
            items, queued_bytes = self._queued
            full = items >= self.queue_items or queued_bytes + nbytes > QUEUE_BYTES
            if not full:
                self._queued = (items + 1, queued_bytes + nbytes)
        if full:
            self.drops.add(request.model, "queue_full")
            return
        self._items.append(request)
        if queued_bytes + nbytes >= self.batch_bytes:
            self._wake.set()

    # -- the thread -----------------------------------------------------------------------

    def _taken(self, nbytes: int) -> None:
        with self._lock:
            items, queued_bytes = self._queued
            self._queued = (items - 1, queued_bytes - nbytes)

    def _run(self) -> None:
        pending: list[CapturedRequest] = []
        pending_bytes = 0
        oldest = 0.0
        while True:
            self._wake.wait(POLL_S)
            self._wake.clear()
            while self._items:
                item = self._items.popleft()
                if isinstance(item, CapturedRequest):
                    self._taken(item.nbytes)
                    if not pending:
                        oldest = time.monotonic()
                    pending.append(item)
                    pending_bytes += item.nbytes
                    if pending_bytes < self.batch_bytes:
                        continue
                if pending:
                    self._store(pending)
                    pending, pending_bytes = [], 0
                if item is None:
                    return
                if isinstance(item, Flush):
                    item.done.set()
            if pending and time.monotonic() - oldest >= FLUSH_AFTER_S:
                self._store(pending)
                pending, pending_bytes = [], 0

    def _store(self, requests: list[CapturedRequest]) -> None:
        try:
            for r in requests:
                r.fingerprint = input_fingerprint(r.inputs)
            self.store(requests)
        except Exception as exc:  # a full disk, a lost connection: never the thread's end
            for r in requests:
                self.drops.add(r.model, self.error_reason)
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "capture: cannot store %d captures in %s (%s): dropped "
                    '(inferd_capture_dropped_total{reason="%s"})',
                    len(requests),
                    self.where(),
                    exc,
                    self.error_reason,
                )

    def where(self) -> str:
        return "the capture store"


class CaptureWriter(CaptureQueue):
    """Shards in `--capture-dir`."""

    def __init__(
        self, settings: CaptureSettings, drops: DropCounts, queue_items: int = QUEUE_ITEMS
    ) -> None:
        assert settings.directory is not None
        super().__init__(drops, settings.shard_bytes, settings.max_bytes, queue_items)
        self.directory = settings.directory
        self.max_bytes = settings.max_bytes
        self.shards_removed = 0  # by the size bound (read by scrapes)
        self._seq = 0
        self._pid = os.getpid()
        self._index = self.directory / f"index-{self._pid}.jsonl"

    def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # counted per capture from now on; requests are unaffected
            log.warning("capture directory %s cannot be made: %s", self.directory, exc)
        super().start()

    def where(self) -> str:
        return str(self.directory)

    def store(self, requests: list[CapturedRequest]) -> None:
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(requests[0].time))
        micros = int(requests[0].time % 1 * 1e6)
        name = f"capture-{stamp}.{micros:06d}Z-{self._pid}-{self._seq:06d}.npz"
        arrays, metas = shard_arrays(requests)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_shard(self.directory / name, arrays)
        lines = b"".join(orjson.dumps({**m, "shard": name}) + b"\n" for m in metas)
        with open(self._index, "ab") as f:
            f.write(lines)
        try:
            self._keep_bound()
        except OSError as exc:  # the shard is written: not a drop; the next one tries again
            log.warning("capture: cannot keep %s within its bound: %s", self.directory, exc)

    def _keep_bound(self) -> None:
        """Remove the oldest shards until those left fit in `max_bytes`; drop their lines
        from this writer's index."""
        sized: list[tuple[Path, int]] = []
        for path in shards(self.directory):
            try:
                sized.append((path, path.stat().st_size))
            except FileNotFoundError:
                continue  # another worker removed it
        total = sum(size for _, size in sized)
        removed: set[str] = set()
        for path, size in sized:
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            removed.add(path.name)
            total -= size
        if not removed:
            return
        self.shards_removed += len(removed)
        try:
            with open(self._index, encoding="utf-8") as f:
                kept = [line for line in f if json.loads(line).get("shard") not in removed]
            tmp = self._index.with_name(self._index.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(tmp, self._index)
        except (OSError, ValueError) as exc:
            log.warning("capture: cannot rewrite the index %s: %s", self._index, exc)
