"""The response cache (issue 18): settings, keys, and the tiered ResponseCache.

The Redis tier (redis_tier.py) imports `redis` only when Redis settings are given."""

from inferd.cache.cache_settings import (
    CacheConfigError,
    CacheSettings,
    LocalSettings,
    RedisSettings,
    parse_cache_config,
)
from inferd.cache.keys import (
    KEY_EXEMPT_PARAMETERS,
    CacheKey,
    KeyOptions,
    UncacheableRequestError,
    cache_key,
)
from inferd.cache.response_cache import ResponseCache
from inferd.cache.tier_stats import LatencyHistogram, TierStats

__all__ = [
    "KEY_EXEMPT_PARAMETERS",
    "CacheConfigError",
    "CacheKey",
    "CacheSettings",
    "KeyOptions",
    "LatencyHistogram",
    "LocalSettings",
    "RedisSettings",
    "ResponseCache",
    "TierStats",
    "UncacheableRequestError",
    "cache_key",
    "parse_cache_config",
]
