"""A model's response cache settings (docs/cache.md): `response_cache { enable: true }` and
the `cache_*` parameters, parsed once at load into `CacheOptions`, errors naming file and
field; and `served_cache`, what a loaded version is served with given whether the server
has a cache (`--cache-config`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from inferd.cache.keys import TEXT_NORMALIZATIONS, KeyOptions
from inferd.config.model_config import CONFIG_FILE, ConfigError, parameter

log = logging.getLogger("inferd.repository")

DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
CACHE_PARAMETERS = (
    "cache_ttl_seconds",
    "cache_max_entries",
    "cache_max_response_bytes",
    "cache_float_decimals",
    "cache_text_normalize",
)


@dataclass(frozen=True, slots=True)
class CacheOptions:
    enabled: bool = False  # response_cache { enable: true }
    ttl_s: float | None = None  # None: the tier's default (--cache-config redis,ttl=...) or none
    max_entries: int | None = None  # the model's bound in the local tier; None: the tier's only
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES  # larger responses are not cached
    key: KeyOptions = KeyOptions()  # cache_float_decimals, cache_text_normalize
    # Seconds an entry is kept past its TTL for a degraded tier to answer from (0: not
    # kept). No cache_* parameter: the degradation tiers set it (dataclasses.replace) from
    # degrade_stale_s (docs/reliability.md); normal lookups never see such entries.
    stale_s: float = 0.0


def read_cache_options(config: mc.ModelConfig) -> CacheOptions:
    where = f"{config.name}/{CONFIG_FILE}"
    for key in sorted(config.parameters):
        if key.startswith("cache_") and key not in CACHE_PARAMETERS:
            raise ConfigError(
                f"{where}: parameters.{key} is not a cache parameter (typo?); the cache "
                f"parameters are {', '.join(CACHE_PARAMETERS)}"
            )
    enabled = bool(config.response_cache.enable)
    if enabled and config.model_transaction_policy.decoupled:
        # Triton refuses it too: a stream of responses is not one cacheable answer.
        raise ConfigError(
            f"{where}: response_cache.enable: a decoupled model's responses cannot be cached "
            "(model_transaction_policy.decoupled is true)"
        )
    if enabled and config.HasField("sequence_batching"):
        # A stateful model's answer depends on the sequence's earlier requests, which the key
        # cannot see: a cached answer would be wrong.
        raise ConfigError(
            f"{where}: response_cache.enable: a sequence-batched (stateful) model's answers "
            "depend on its sequence's state and cannot be cached"
        )
    set_keys = [k for k in CACHE_PARAMETERS if k in config.parameters]
    if set_keys and not enabled:
        # Never accept what is not honoured: these do nothing without the cache.
        raise ConfigError(
            f"{where}: parameters.{set_keys[0]} is set but response_cache {{ enable: true }} "
            "is not: the model is not cached"
        )
    where += ": parameters"
    decimals = _int_in_range_parameter(config, "cache_float_decimals", where, 0, 15)
    return CacheOptions(
        enabled=enabled,
        ttl_s=_seconds_parameter(config, "cache_ttl_seconds", where),
        max_entries=_int_in_range_parameter(config, "cache_max_entries", where, 1, None),
        max_response_bytes=_int_in_range_parameter(
            config, "cache_max_response_bytes", where, 1, None
        )
        or DEFAULT_MAX_RESPONSE_BYTES,
        key=KeyOptions(float_decimals=decimals, text_normalize=_normalizers(config, where)),
    )


def served_cache(
    model: str, options: CacheOptions, server_has_cache: bool, server_has_local: bool = True
) -> CacheOptions | None:
    """The options a loaded version is served with: None unless its config enables the cache
    and the server has one. Only the config: as Triton, the model serves uncached, and never
    silently (a WARNING naming the model and the missing flag). ConfigError for
    cache_max_entries on a server whose cache has no local tier: it bounds that tier only."""
    if not options.enabled:
        return None
    if server_has_cache and not server_has_local and options.max_entries is not None:
        raise ConfigError(
            f"{model}/{CONFIG_FILE}: parameters.cache_max_entries bounds the local tier's "
            "entries, and the server's cache has no local tier (--cache-config local,size=...)"
        )
    if not server_has_cache:
        log.warning(
            "model %s enables response_cache but the server has no cache (--cache-config): "
            "its answers are not cached",
            model,
        )
        return None
    return options


def _seconds_parameter(config: mc.ModelConfig, key: str, where: str) -> float | None:
    raw = parameter(config, key).strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}.{key} must be a number of seconds > 0, got '{raw}'")
    return value


def _int_in_range_parameter(
    config: mc.ModelConfig, key: str, where: str, low: int, high: int | None
) -> int | None:
    raw = parameter(config, key).strip()
    if not raw:
        return None
    value = int(raw) if raw.lstrip("-").isdigit() else None
    if value is None or value < low or (high is not None and value > high):
        bound = f"within {low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"{where}.{key} must be an integer {bound}, got '{raw}'")
    return value


def _normalizers(config: mc.ModelConfig, where: str) -> tuple[str, ...]:
    raw = parameter(config, "cache_text_normalize")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for name in names:
        if name not in TEXT_NORMALIZATIONS:
            raise ConfigError(
                f"{where}.cache_text_normalize: '{name}' is not one of "
                f"{', '.join(TEXT_NORMALIZATIONS)}, got '{raw}'"
            )
    # Applied in one fixed order whatever the order written, so equal sets key alike.
    return tuple(n for n in TEXT_NORMALIZATIONS if n in names)
