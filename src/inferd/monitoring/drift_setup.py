"""A model version's drift monitor at load: its reference (the file beside the model, the
first rows served, or none), checked before the version may serve; scipy is imported here
only, so a server without the `monitoring` extra runs every model that asks for no drift
monitoring (docs/monitoring.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tritonclient.grpc import model_config_pb2 as mc

from inferd.monitoring.drift_spec import (
    REFERENCE_AUTO,
    REFERENCE_FILE,
    REFERENCE_FIRST,
    DriftOptions,
)

if TYPE_CHECKING:
    from inferd.monitoring.drift_sampler import DriftMonitor
    from inferd.monitoring.reference import Reference

REFERENCE_NAME = "reference.npz"  # beside the model file, in the version directory


class DriftSetupError(RuntimeError):
    """The version cannot be monitored as its config asks: its load fails with this."""


def monitor_for_load(
    name: str,
    version: str,
    config: mc.ModelConfig,
    options: DriftOptions,
    version_dir: Path,
) -> DriftMonitor | None:
    """The version's monitor, not started (None: no drift monitoring). Reads the reference
    file: call it off the event loop."""
    path = version_dir / REFERENCE_NAME
    where = f"{name}/{version}/{REFERENCE_NAME}"
    mode = options.reference
    if mode == REFERENCE_AUTO:
        mode = REFERENCE_FILE if path.is_file() else ""
    if mode == REFERENCE_FILE:
        if not path.is_file():
            raise DriftSetupError(
                f"{name}/config.pbtxt: parameters.drift_reference is 'file' but {where} "
                "does not exist"
            )
        need_scipy(name)
        from inferd.monitoring.reference import ReferenceError, read_reference_file, tensor_plans

        plans = tensor_plans(config, options)
        try:
            reference = read_reference_file(path, plans, options, where)
        except ReferenceError as exc:
            raise DriftSetupError(str(exc)) from None
        return new_monitor(name, version, config, options, reference)
    if mode == REFERENCE_FIRST:
        need_scipy(name)
        return new_monitor(name, version, config, options, None)
    return None


def new_monitor(
    name: str,
    version: str,
    config: mc.ModelConfig,
    options: DriftOptions,
    reference: Reference | None,
) -> DriftMonitor:
    from inferd.monitoring.drift_sampler import DriftMonitor
    from inferd.monitoring.reference import tensor_plans

    plans = tensor_plans(config, options)
    return DriftMonitor(name, version, plans, options, config.max_batch_size > 0, reference)


def need_scipy(name: str) -> None:
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        raise DriftSetupError(
            f"model '{name}' asks for drift monitoring (a {REFERENCE_NAME} or "
            "parameters.drift_reference) but scipy is not installed: pip install "
            "'inferd[monitoring]', or set drift_reference to 'none'"
        ) from None
