"""A model's degradation tiers (docs/reliability.md#degradation-tiers): the `degrade_*`
parameters, parsed once at load into `DegradePolicy`; every error names the file and the
parameter. A tier that could not do what it says (a fallback without `fallback_model`, stale
answers without the response cache, a stateful or decoupled model) fails the load."""

from __future__ import annotations

import math

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import CONFIG_FILE, ConfigError, parameter
from inferd.reliability.degrade.tiers import DegradePolicy, TierSyntaxError, parse_tiers

DEGRADE_PARAMETERS = (
    "degrade_p99_ms",
    "degrade_window_s",
    "degrade_min_requests",
    "degrade_release_ratio",
    "degrade_dwell_s",
    "degrade_probe_interval_ms",
    "degrade_stale_s",
    "degrade_rollback_within_s",
)
_DEFAULTS = DegradePolicy()


def read_degrade_policy(config: mc.ModelConfig) -> DegradePolicy:
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    given = sorted(k for k in config.parameters if k.startswith("degrade_"))
    for key in given:
        if key not in DEGRADE_PARAMETERS:
            raise ConfigError(
                f"{where}.{key} is not a degradation parameter (typo?); they are "
                f"{', '.join(DEGRADE_PARAMETERS)}"
            )
    if not given:
        return _DEFAULTS
    raw = parameter(config, "degrade_p99_ms")
    if not raw.strip():
        raise ConfigError(
            f"{where}.{given[0]} is set but degrade_p99_ms is not: a model degrades only by "
            "the tiers degrade_p99_ms declares"
        )
    try:
        tiers = parse_tiers(raw)
    except TierSyntaxError as exc:
        raise ConfigError(f"{where}.degrade_p99_ms: {exc}; got '{raw}'") from None
    if config.model_transaction_policy.decoupled:
        raise ConfigError(
            f"{where}.degrade_p99_ms: a decoupled model's requests are streams, whose "
            "latency is not one answer's; degradation tiers need a unary model"
        )
    if config.HasField("sequence_batching"):
        raise ConfigError(
            f"{where}.degrade_p99_ms: a sequence-batched (stateful) model's requests cannot "
            "move to another model mid-sequence; degradation tiers need a stateless model"
        )
    fallback = parameter(config, "fallback_model")
    policy = DegradePolicy(
        tiers=tiers,
        window_s=_number(config, "degrade_window_s", where, _DEFAULTS.window_s, low=0.0),
        min_requests=int(
            _number(config, "degrade_min_requests", where, _DEFAULTS.min_requests, 1.0, True)
        ),
        release_ratio=_number(
            config, "degrade_release_ratio", where, _DEFAULTS.release_ratio, low=0.0, high=1.0
        ),
        dwell_s=_number(config, "degrade_dwell_s", where, _DEFAULTS.dwell_s, low=0.0, zero=True),
        probe_interval_s=_number(
            config, "degrade_probe_interval_ms", where, _DEFAULTS.probe_interval_s * 1000, 0.0
        )
        / 1000,
        stale_s=_number(config, "degrade_stale_s", where, _DEFAULTS.stale_s, low=0.0),
        rollback_within_s=_number(
            config, "degrade_rollback_within_s", where, _DEFAULTS.rollback_within_s, low=0.0
        ),
        fallback_model=fallback,
    )
    if policy.uses_fallback and not fallback:
        number = next(t.number for t in tiers if t.fallback_share)
        raise ConfigError(
            f"{where}.degrade_p99_ms: tier {number} sends traffic to the fallback model, but "
            "parameters.fallback_model is not set"
        )
    if policy.uses_stale and not config.response_cache.enable:
        number = next(t.number for t in tiers if t.stale)
        raise ConfigError(
            f"{where}.degrade_p99_ms: tier {number} answers from stale cache entries, but "
            "response_cache { enable: true } is not set: the model is not cached"
        )
    for key, needs in (("degrade_stale_s", "stale"), ("degrade_rollback_within_s", "rollback")):
        if key in config.parameters and not any(getattr(t, needs) for t in tiers):
            raise ConfigError(
                f"{where}.{key} is set but no tier of degrade_p99_ms has the action '{needs}'"
            )
    return policy


def _number(
    config: mc.ModelConfig,
    key: str,
    where: str,
    default: float,
    low: float,
    integer: bool = False,
    high: float | None = None,
    zero: bool = False,
) -> float:
    """The parameter as a number > low (>= low with `zero`, <= high), else the default."""
    raw = parameter(config, key).strip()
    if not raw:
        return default
    try:
        value = float(raw) if not integer or raw.isdigit() else math.nan
    except ValueError:
        value = math.nan
    ok = math.isfinite(value) and (value >= low if zero or integer else value > low)
    if ok and high is not None:
        ok = value <= high
    if not ok:
        kind = "an integer" if integer else "a number"
        bound = f">= {low:g}" if zero or integer else f"> {low:g}"
        if high is not None:
            bound += f" and <= {high:g}"
        raise ConfigError(f"{where}.{key} must be {kind} {bound}, got '{raw}'")
    return value
