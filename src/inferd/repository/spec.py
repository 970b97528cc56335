"""A model's typed spec: its `ModelConfig` and `parameters` parsed once, at load.

`parse_spec` runs where the loader validates the config (`loader.prepare`), so a bad value
fails the load with an error naming the file, the field or parameter and the value; the
server's consumers (scheduler, router, circuit, warm-up, readiness, metrics, backends) then
read fields of the spec, never the config's strings, and nothing re-parses per request,
readiness check or scrape. `parse_spec` (with config/input_limits.py, config/backend_parameters.py,
monitoring/drift_spec.py, cache/model_cache_spec.py and reliability/degrade/tier_spec.py) is the
only reader of `parameters`: a test holds it to that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from inferd.cache.model_cache_spec import CacheOptions, read_cache_options
from inferd.config.backend_parameters import BackendSettings, read_backend_settings
from inferd.config.input_limits import InputLimits, read_limits
from inferd.config.model_config import (
    CONFIG_FILE,
    ConfigError,
    group_waste,
    instance_count,
    int_parameter,
    parameter,
)
from inferd.errors import InferdError
from inferd.monitoring.capture_settings import (
    DEFAULT_ACCURACY_WINDOW,
    DEFAULT_FEEDBACK_TTL_S,
    CaptureOptions,
)
from inferd.monitoring.drift_spec import DriftOptions, read_drift_options
from inferd.reliability.circuit import CircuitPolicy
from inferd.reliability.degrade.tier_spec import read_degrade_policy
from inferd.reliability.degrade.tiers import DegradePolicy
from inferd.reliability.routing import RollbackPolicy, parse_weights
from inferd.scheduling.batcher import BatchingOptions
from inferd.scheduling.queues import QueuePolicy
from inferd.scheduling.sequence.sequence_config import SequenceOptions, read_sequence_options

BATCHING_POLICIES = ("work_conserving", "window", "none")
DEFAULT_UNREADY_AFTER_FAILURES = 5


@dataclass(frozen=True, slots=True)
class ModelSpec:
    batching: BatchingOptions  # dynamic_batching, its queue policies, batching_policy
    limits: InputLimits  # max_input_shape, max_input_elements, max_bytes_element_size
    canary: RollbackPolicy  # canary_auto_rollback and the guard's thresholds
    circuit: CircuitPolicy  # circuit_breaker_*, fallback_model
    backend: BackendSettings  # the backend's own keys
    instance_count: int  # across instance groups (Triton's default: one)
    decoupled: bool  # model_transaction_policy
    sequence: SequenceOptions | None = None  # sequence_batching; None: not a sequence model
    canary_weights: dict[str, int] | None = None  # None: the config sets none
    auto_warmup: bool = True
    unready_after_failures: int = DEFAULT_UNREADY_AFTER_FAILURES  # 0: never
    execution_timeout_ms: int | None = None  # None: the server's --execution-timeout-ms
    health_p99_baseline_s: float | None = None  # None: the health score's own baseline
    text_inputs: frozenset[str] = frozenset()  # BYTES inputs the model decodes as UTF-8
    capture: CaptureOptions = CaptureOptions()  # capture_sample_rate, accuracy_* (capture.md)
    drift: DriftOptions = DriftOptions()  # drift_* (docs/monitoring.md)
    cache: CacheOptions = CacheOptions()  # response_cache, cache_* (docs/cache.md)
    degrade: DegradePolicy = DegradePolicy()  # degrade_* (docs/reliability.md)

    def execution_timeout_s(self, default_ms: int) -> float:
        """The execution timeout in seconds (0: none); `default_ms` the server's. A decoupled
        model's stream may rightly run long: only its own parameter bounds it."""
        if self.execution_timeout_ms is not None:
            return self.execution_timeout_ms / 1000
        return 0.0 if self.decoupled else default_ms / 1000


def parse_spec(config: mc.ModelConfig, model_dir: Path) -> ModelSpec:
    """The spec of a completed, validated config; raises `ConfigError` naming file, field and
    value for the first bad one. Reads a sequence model's initial-state files: call it off
    the event loop."""
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    raw = parameter(config, "unready_after_failures", str(DEFAULT_UNREADY_AFTER_FAILURES))
    if not raw.isdigit():
        raise ConfigError(f"{where}.unready_after_failures must be an integer >= 0, got '{raw}'")
    degrade = read_degrade_policy(config)
    cache = read_cache_options(config)
    if degrade.uses_stale:  # entries are kept past their TTL for the tier to answer from
        cache = replace(cache, stale_s=degrade.stale_s)
    return ModelSpec(
        batching=batching_options(config),
        limits=read_limits(config),
        canary=_canary_policy(config),
        circuit=_circuit_policy(config),
        backend=read_backend_settings(config),
        instance_count=instance_count(config),
        decoupled=bool(config.model_transaction_policy.decoupled),
        sequence=read_sequence_options(config, model_dir),
        canary_weights=_canary_weights(config),
        auto_warmup=parameter(config, "auto_warmup", "true").lower() not in ("0", "false", "no"),
        unready_after_failures=int(raw),
        execution_timeout_ms=_execution_timeout_ms(config),
        health_p99_baseline_s=_health_baseline_s(config),
        text_inputs=_text_inputs(config),
        capture=_capture_options(config),
        drift=read_drift_options(config),
        cache=cache,
        degrade=degrade,
    )


def batching_options(config: mc.ModelConfig) -> BatchingOptions:
    db = config.dynamic_batching
    policy = parameter(config, "batching_policy", "work_conserving")
    if policy not in BATCHING_POLICIES:
        raise ConfigError(
            f"{config.name}/{CONFIG_FILE}: parameters.batching_policy '{policy}' must be one "
            f"of {', '.join(BATCHING_POLICIES)}"
        )
    levels = int(db.priority_levels)
    default = (
        _queue_policy(db.default_queue_policy)
        if db.HasField("default_queue_policy")
        else QueuePolicy()
    )
    policies = tuple(
        _queue_policy(db.priority_queue_policy[level])
        if level in db.priority_queue_policy
        else default
        for level in range(1, max(1, levels) + 1)
    )
    default_level = int(db.default_priority_level) if levels else 1
    waste, window = _length_grouping(config)
    return BatchingOptions(
        max_batch_size=int(config.max_batch_size),
        preferred_sizes=tuple(int(s) for s in db.preferred_batch_size),
        max_delay_s=db.max_queue_delay_microseconds / 1e6,
        policy=policy,
        group_waste=waste,
        group_window=window,
        queue_policies=policies,
        default_priority=max(0, default_level - 1),
    )


def _length_grouping(config: mc.ModelConfig) -> tuple[float, int]:
    """`pad_grouping_waste` and `pad_grouping_window` (length_groups.py): on by default for
    a model that pads (`pad_inputs`), with a waste of 0.25 and a window of 4 batches."""
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    raw_waste = parameter(config, "pad_grouping_waste").strip()
    raw_window = parameter(config, "pad_grouping_window").strip()
    if not parameter(config, "pad_inputs").strip():
        for key, raw in (("pad_grouping_waste", raw_waste), ("pad_grouping_window", raw_window)):
            if raw:
                raise ConfigError(
                    f"{where}.{key}: needs pad_inputs (length grouping batches "
                    "requests a model pads)"
                )
        return -1.0, 0
    waste = group_waste(raw_waste or "0.25")
    if waste is None:
        raise ConfigError(
            f"{where}.pad_grouping_waste: must be a number >= 0 (the padding a batch may "
            f"carry, as a share of its real elements) or `off`, got '{raw_waste}'"
        )
    window = int_parameter(config, "pad_grouping_window", 4 * int(config.max_batch_size))
    if window < 1:
        raise ConfigError(f"{where}.pad_grouping_window: must be >= 1, got {window}")
    if waste >= 0 and config.dynamic_batching.preferred_batch_size:
        raise ConfigError(
            f"{config.name}/{CONFIG_FILE}: dynamic_batching.preferred_batch_size: not used "
            "when batches are grouped by length (pad_inputs); remove it, or set "
            "pad_grouping_waste to `off`"
        )
    return waste, window


def _queue_policy(p: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=int(p.max_queue_size),
        default_timeout_us=int(p.default_timeout_microseconds),
        allow_timeout_override=bool(p.allow_timeout_override),
        reject_on_timeout=p.timeout_action != mc.ModelQueuePolicy.DELAY,
    )


def _canary_policy(config: mc.ModelConfig) -> RollbackPolicy:
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    try:
        return RollbackPolicy(
            enabled=parameter(config, "canary_auto_rollback", "false").lower()
            in ("1", "true", "yes"),
            window_s=float(parameter(config, "canary_window_s", "30")),
            min_requests=int(parameter(config, "canary_min_requests", "20")),
            error_rate_margin=float(parameter(config, "canary_error_rate_margin", "0.05")),
            p99_ratio=float(parameter(config, "canary_p99_ratio", "2.0")),
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: a canary_* value is not a number: {exc}") from None


def _circuit_policy(config: mc.ModelConfig) -> CircuitPolicy:
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    try:
        policy = CircuitPolicy(
            failures=int(parameter(config, "circuit_breaker_failures", "0")),
            error_rate=float(parameter(config, "circuit_breaker_error_rate", "0")),
            window_s=float(parameter(config, "circuit_breaker_window_s", "30")),
            min_requests=int(parameter(config, "circuit_breaker_min_requests", "20")),
            open_s=float(parameter(config, "circuit_breaker_open_s", "10")),
            fallback_model=parameter(config, "fallback_model", ""),
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: a circuit_breaker_* value is not a number: {exc}") from None
    if not 0 <= policy.error_rate <= 1:
        raise ConfigError(f"{where}: circuit_breaker_error_rate must be within 0..1")
    if policy.fallback_model == config.name:
        raise ConfigError(f"{where}: fallback_model cannot be the model itself")
    return policy


def _canary_weights(config: mc.ModelConfig) -> dict[str, int] | None:
    raw = parameter(config, "canary_weights")
    if not raw:
        return None
    try:
        return parse_weights(raw, f"{config.name}/{CONFIG_FILE}: parameters.canary_weights")
    except InferdError as exc:
        raise ConfigError(exc.message) from None


def _execution_timeout_ms(config: mc.ModelConfig) -> int | None:
    if not parameter(config, "execution_timeout_ms"):
        return None
    timeout_ms = int_parameter(config, "execution_timeout_ms", 0)
    if timeout_ms < 0:
        raise ConfigError(
            f"{config.name}/{CONFIG_FILE}: parameters.execution_timeout_ms must be >= 0 "
            f"(milliseconds; 0: no timeout), got {timeout_ms}"
        )
    return timeout_ms


def _health_baseline_s(config: mc.ModelConfig) -> float | None:
    raw = parameter(config, "health_p99_baseline_ms")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{config.name}/{CONFIG_FILE}: parameters.health_p99_baseline_ms must be a number "
            f"of milliseconds > 0, got '{raw}'"
        )
    return value / 1000


def _text_inputs(config: mc.ModelConfig) -> frozenset[str]:
    """`text_inputs: "a,b"`: BYTES inputs a model (a Python one) decodes as UTF-8, so a
    request whose bytes are not is the request's 400, found before it joins a batch of
    others' requests, rather than an exception failing that batch."""
    names = frozenset(n.strip() for n in parameter(config, "text_inputs").split(",") if n.strip())
    strings = {i.name for i in config.input if i.data_type == mc.TYPE_STRING}
    for name in sorted(names - strings):
        raise ConfigError(
            f"{config.name}/{CONFIG_FILE}: parameters: text_inputs: '{name}' is not a "
            "TYPE_STRING (BYTES) input of the model"
        )
    return names


def _capture_options(config: mc.ModelConfig) -> CaptureOptions:
    """`capture_sample_rate`, `accuracy_window`, `accuracy_output`, `feedback_ttl_s`,
    `canary_accuracy_margin` (docs/capture.md)."""
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    raw = parameter(config, "capture_sample_rate", "0")
    rate = _number(raw)
    if not 0 <= rate <= 1:
        raise ConfigError(
            f"{where}.capture_sample_rate must be a share within 0..1 (0.01: one request in "
            f"a hundred), got '{raw}'"
        )
    window = int_parameter(config, "accuracy_window", DEFAULT_ACCURACY_WINDOW)
    if window < 1:
        raise ConfigError(f"{where}.accuracy_window must be >= 1 (labelled rows), got {window}")
    output = parameter(config, "accuracy_output")
    names = [o.name for o in config.output]
    if output and output not in names:
        raise ConfigError(
            f"{where}.accuracy_output '{output}' is not an output of the model "
            f"(outputs: {', '.join(names) or 'none'})"
        )
    raw = parameter(config, "feedback_ttl_s", str(DEFAULT_FEEDBACK_TTL_S))
    ttl_s = _number(raw)
    if not ttl_s > 0 or not math.isfinite(ttl_s):
        raise ConfigError(f"{where}.feedback_ttl_s must be a number of seconds > 0, got '{raw}'")
    raw = parameter(config, "canary_accuracy_margin")
    margin = _number(raw) if raw else None
    if margin is not None and not 0 <= margin <= 1:
        raise ConfigError(
            f"{where}.canary_accuracy_margin must be a share within 0..1 (0.02: two points "
            f"of accuracy), got '{raw}'"
        )
    return CaptureOptions(rate, window, output or (names[0] if names else ""), ttl_s, margin)


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        return math.nan
