"""`--capture-redis URL`: sampled requests as entries of a Redis stream, capped in length.

Each capture is one `XADD <stream> MAXLEN <n>` entry (exact trimming: the stream never
holds more than `--capture-redis-maxlen` entries, the oldest go first) with the fields
`id`, `time`, `model`, `version`, `fingerprint`, `protocol`, and `npz`: the capture as a
one-request shard (capture_files.py's format), so it loads back as a file's captures do.
A batch goes in one pipelined round trip, from the writer's thread: never from the event
loop, and a Redis that is down or slow (2 s timeouts) drops captures, counted as
`redis_error`, never a request. `load_redis_capture` reads the stream back.
"""

from __future__ import annotations

import io
from typing import Any

from inferd.monitoring.capture_files import (
    Captured,
    CapturedRequest,
    npz_bytes,
    read_shard,
    shard_arrays,
)
from inferd.monitoring.capture_settings import CaptureOptionError
from inferd.monitoring.capture_writer import QUEUE_ITEMS, CaptureQueue, DropCounts

BATCH_BYTES = 1024 * 1024
TIMEOUT_S = 2.0


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise CaptureOptionError(
            "--capture-redis needs the redis client: pip install 'inferd[redis]'"
        ) from None
    return redis


class RedisCaptureWriter(CaptureQueue):
    error_reason = "redis_error"
    thread_name = "inferd-capture-redis"

    def __init__(
        self, url: str, stream: str, maxlen: int, drops: DropCounts, queue_items: int = QUEUE_ITEMS
    ) -> None:
        redis = _redis_module()
        try:
            self.client = redis.Redis.from_url(
                url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
            )
        except ValueError as exc:
            raise CaptureOptionError(f"--capture-redis {url!r}: {exc}") from None
        super().__init__(drops, BATCH_BYTES, None, queue_items)
        self.url = url
        self.stream = stream
        self.maxlen = maxlen

    def store(self, requests: list[CapturedRequest]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for r in requests:
            arrays, _ = shard_arrays([r])
            fields = {
                "id": r.id,
                "time": repr(r.time),
                "model": r.model,
                "version": r.version,
                "fingerprint": r.fingerprint,
                "protocol": r.protocol,
                "npz": bytes(npz_bytes(arrays)),
            }
            pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=False)
        pipe.execute()

    def where(self) -> str:
        return f"Redis stream {self.stream!r} at {self.url}"

    def close(self, timeout_s: float = 10.0) -> None:
        super().close(timeout_s)
        self.client.close()


def load_redis_capture(client: Any, stream: str = "inferd:capture") -> list[Captured]:
    """Every capture in the stream, oldest first: `client` is a `redis.Redis` (or a URL)."""
    if isinstance(client, str):
        client = _redis_module().Redis.from_url(client)
    rows: list[Captured] = []
    for entry_id, fields in client.xrange(stream):
        name = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        rows.extend(read_shard(io.BytesIO(fields[b"npz"]), name))
    return rows
