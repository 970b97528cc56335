"""`--cache-config` values parsed into per-tier settings (Triton's flag, Triton's names).

Two forms, mixed freely and merged per tier, as Triton's own parser merges them:

    --cache-config local,size=64M
    --cache-config redis,host=cache,port=6380,ttl=300,timeout_ms=20,insert_timeout_ms=1000
    --cache-config redis,host=cache --cache-config redis,port=6380     (Triton's: one per flag)

Redis also takes Triton's redis cache settings: user, pool_size, wait_timeout,
connect_timeout, socket_timeout (milliseconds). Whatever they say, timeout_ms still bounds
every lookup as a whole, and insert_timeout_ms every background insert (Triton's 0, "wait
forever", lifts only the per-socket bound).

A setting given twice with different values, a tier or setting we do not know, a missing
required setting (redis without host, local without size) or a malformed value is a
CacheConfigError naming the tier and the setting: we never accept what we do not honour.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# A lookup is on the request's path: a slow Redis costs each request at most this much.
TIMEOUT_MS = 50.0
# An insert is background work (docs/cache.md): it may wait out a busy host's stalls.
INSERT_TIMEOUT_MS = 1000.0


class CacheConfigError(ValueError):
    """A `--cache-config` value we cannot honour; the message names tier and setting."""


@dataclass(frozen=True)
class LocalSettings:
    size_bytes: int  # bound on the bytes of stored entries (keys + values)


@dataclass(frozen=True)
class RedisSettings:
    host: str
    port: int = 6379
    password: str | None = None
    db: int = 0
    ttl_s: float | None = None  # default TTL for entries (per model cache_ttl_seconds wins)
    timeout_ms: float = TIMEOUT_MS  # bound on every lookup (on the request's path)
    insert_timeout_ms: float = INSERT_TIMEOUT_MS  # bound on every background insert
    # Added to the shared interface, Triton's redis cache settings (all milliseconds):
    user: str | None = None  # Redis ACL user (Triton's `user`; None: the default user)
    pool_size: int | None = None  # at most this many connections (None: as many as needed)
    wait_timeout_ms: float | None = None  # wait for a pooled connection (needs pool_size)
    connect_timeout_ms: float | None = None  # per socket connect (None: timeout_ms; 0: none)
    socket_timeout_ms: float | None = None  # per socket read/write (None: timeout_ms; 0: none)


@dataclass(frozen=True)
class CacheSettings:
    local: LocalSettings | None = None
    redis: RedisSettings | None = None

    @property
    def enabled(self) -> bool:
        return self.local is not None or self.redis is not None


_SIZE = re.compile(r"(\d+)([KMG]?)(I?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
SIZE_FORM = "a positive number of bytes, optionally with K, M or G (KiB, MiB, GiB: 64M = 67108864)"


def parse_size(text: str) -> int:
    """`1048576`, `64K`, `64KiB`, `64M`, `1G` (binary units) -> bytes; ValueError otherwise."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size <= 0:
        raise ValueError(text)
    return size


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(text)
    return port


def _db(text: str) -> int:
    db = int(text)
    if db < 0:
        raise ValueError(text)
    return db


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(text)
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def _milliseconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(text)
    return value


def _host(text: str) -> str:
    if not text:
        raise ValueError(text)
    return text


# setting -> (dataclass field, parser, what a valid value looks like)
_Parser = Callable[[str], Any]
_LOCAL: dict[str, tuple[str, _Parser, str]] = {
    "size": ("size_bytes", parse_size, SIZE_FORM),
}
_REDIS: dict[str, tuple[str, _Parser, str]] = {
    "host": ("host", _host, "a host name or address"),
    "port": ("port", _port, "an integer 1..65535"),
    "password": ("password", str, "a string"),
    "db": ("db", _db, "an integer >= 0"),
    "ttl": ("ttl_s", _positive_float, "seconds, a number > 0"),
    "timeout_ms": ("timeout_ms", _positive_float, "milliseconds, a number > 0"),
    "insert_timeout_ms": ("insert_timeout_ms", _positive_float, "milliseconds, a number > 0"),
    "user": ("user", _host, "a user name"),
    "pool_size": ("pool_size", _positive_int, "an integer > 0"),
    "wait_timeout": ("wait_timeout_ms", _milliseconds, "milliseconds, a number >= 0"),
    "connect_timeout": ("connect_timeout_ms", _milliseconds, "milliseconds, a number >= 0"),
    "socket_timeout": ("socket_timeout_ms", _milliseconds, "milliseconds, a number >= 0"),
}
_TIERS = {"local": _LOCAL, "redis": _REDIS}
_REQUIRED = {"local": "size", "redis": "host"}


def _shown(setting: str, text: str) -> str:
    return "(hidden)" if setting == "password" else repr(text)


def _where(tier: str, setting: str) -> str:
    return f"--cache-config {tier},{setting}"


def parse_cache_config(values: Sequence[str]) -> CacheSettings:
    """The values of repeated `--cache-config` flags, merged per tier (see the module doc)."""
    given: dict[str, dict[str, str]] = {}
    for value in values:
        tier, _, rest = value.partition(",")
        tier = tier.strip()
        if tier not in _TIERS:
            raise CacheConfigError(
                f"--cache-config {value!r}: unknown cache {tier!r}, expected local or redis"
            )
        if not rest.strip():
            raise CacheConfigError(
                f"--cache-config {value!r}: no settings for {tier}, expected {tier},name=value"
            )
        settings = given.setdefault(tier, {})
        for item in rest.split(","):
            name, eq, text = item.partition("=")
            name = name.strip()
            if not eq:
                raise CacheConfigError(
                    f"--cache-config {value!r}: {tier} setting {item!r} is not name=value"
                )
            if name not in _TIERS[tier]:
                raise CacheConfigError(
                    f"{_where(tier, name)}: unknown {tier} setting {name!r}, "
                    f"expected one of {', '.join(_TIERS[tier])}"
                )
            if name in settings and settings[name] != text:
                raise CacheConfigError(
                    f"{_where(tier, name)}: given twice with different values "
                    f"({_shown(name, settings[name])} and {_shown(name, text)})"
                )
            settings[name] = text
    local = _build("local", given["local"]) if "local" in given else None
    redis = _build("redis", given["redis"]) if "redis" in given else None
    return CacheSettings(
        local=local if isinstance(local, LocalSettings) else None,
        redis=redis if isinstance(redis, RedisSettings) else None,
    )


def _build(tier: str, settings: dict[str, str]) -> LocalSettings | RedisSettings:
    required = _REQUIRED[tier]
    if required not in settings:
        raise CacheConfigError(f"{_where(tier, required)}: {tier} needs {required}=...")
    fields: dict[str, Any] = {}
    for name, text in settings.items():
        field_name, parse, form = _TIERS[tier][name]
        try:
            fields[field_name] = parse(text)
        except ValueError:
            raise CacheConfigError(f"{_where(tier, name)}={text}: expected {form}") from None
    if tier == "local":
        return LocalSettings(**fields)
    if "wait_timeout" in settings and "pool_size" not in settings:
        raise CacheConfigError(
            f"{_where(tier, 'wait_timeout')}: waits for a pooled connection, "
            "and there is no pool bound without pool_size=N"
        )
    return RedisSettings(**fields)
