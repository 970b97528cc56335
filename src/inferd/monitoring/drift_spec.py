"""The `drift_*` parameters of a model config, parsed once at load into `DriftOptions`
(docs/monitoring.md): where the reference distribution comes from, the window, the sample
rate and CPU budget of the background tests, and the alert thresholds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import CONFIG_FILE, ConfigError, parameter

# drift_reference: where a version's reference comes from.
REFERENCE_AUTO = "auto"  # the default: `<version>/reference.npz` if it exists, else none
REFERENCE_FILE = "file"  # `<version>/reference.npz`, which must exist
REFERENCE_FIRST = "first"  # the first K rows served after load (`first:K`)
REFERENCE_NONE = "none"  # no drift monitoring until an admin sets a reference


@dataclass(frozen=True, slots=True)
class DriftOptions:
    reference: str = REFERENCE_AUTO
    first_rows: int = 0  # K of `first:K`
    window: int = 1000  # rows per window of live samples
    sample_rate: float = 1.0  # fraction of executed batches whose rows are sampled
    max_columns: int = 64  # flattened columns tested per tensor (the first ones)
    cpu_budget: float = 0.02  # share of one core the background tests may use
    p_value_threshold: float = 0.001  # KS / chi-square: alert below (columns corrected)
    psi_threshold: float = 0.2  # population stability index: alert above
    class_outputs: frozenset[str] = frozenset()  # outputs compared as predicted classes


def read_drift_options(config: mc.ModelConfig) -> DriftOptions:
    where = f"{config.name}/{CONFIG_FILE}: parameters"
    if config.platform == "ensemble":
        for key in sorted(k for k in config.parameters if k.startswith("drift_")):
            # An ensemble executes no batch of its own: nothing would be monitored.
            raise ConfigError(
                f"{where}.{key}: an ensemble is not drift-monitored itself; set drift "
                "parameters (or a reference.npz) on its composing models"
            )
    reference, first_rows = _reference(config, where)
    outputs = {o.name for o in config.output}
    classes = frozenset(
        n.strip() for n in parameter(config, "drift_class_outputs").split(",") if n.strip()
    )
    for name in sorted(classes - outputs):
        raise ConfigError(f"{where}.drift_class_outputs: '{name}' is not an output of the model")
    return DriftOptions(
        reference=reference,
        first_rows=first_rows,
        window=_bounded_parameter(config, "drift_window", where, 1000, int, 10, None),
        sample_rate=_bounded_parameter(config, "drift_sample_rate", where, 1.0, float, 0.0, 1.0),
        max_columns=_bounded_parameter(config, "drift_max_columns", where, 64, int, 1, None),
        cpu_budget=_bounded_parameter(config, "drift_cpu_budget", where, 0.02, float, 0.001, 1.0),
        p_value_threshold=_bounded_parameter(
            config, "drift_p_value_threshold", where, 0.001, float, 0.0, 1.0
        ),
        psi_threshold=_bounded_parameter(
            config, "drift_psi_threshold", where, 0.2, float, 0.0, None
        ),
        class_outputs=classes,
    )


def _reference(config: mc.ModelConfig, where: str) -> tuple[str, int]:
    raw = parameter(config, "drift_reference", REFERENCE_AUTO).strip()
    if raw in (REFERENCE_AUTO, REFERENCE_FILE, REFERENCE_NONE):
        return raw, 0
    kind, _, count = raw.partition(":")
    if kind == REFERENCE_FIRST and count.isdigit() and int(count) >= 10:
        return REFERENCE_FIRST, int(count)
    raise ConfigError(
        f"{where}.drift_reference must be 'file', 'first:K' (K >= 10 rows) or 'none', got '{raw}'"
    )


def _bounded_parameter(
    config: mc.ModelConfig,
    key: str,
    where: str,
    default: float,
    kind: type[int] | type[float],
    low: float,
    high: float | None,
) -> Any:
    """An int or float parameter within low..high, else a load error naming it."""
    raw = parameter(config, key)
    if not raw:
        return default
    try:
        value: float | None = kind(raw)
    except ValueError:
        value = None
    if (
        value is None
        or not math.isfinite(value)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"within {low:g}..{high:g}" if high is not None else f">= {low:g}"
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{where}.{key} must be {what} {bound}, got '{raw}'")
    return value
