"""What `GET /v2/models/{m}/drift` answers, and the admin call that sets a version's
reference (an .npz archive, or JSON arrays), for the HTTP routes and the gRPC admin
service alike (docs/monitoring.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inferd.errors import invalid
from inferd.monitoring.drift_sampler import DriftMonitor, TensorDrift
from inferd.monitoring.drift_setup import DriftSetupError, need_scipy, new_monitor
from inferd.monitoring.reference import (
    BYTES,
    Reference,
    ReferenceError,
    parse_reference,
    reference_of,
    tensor_plans,
)
from inferd.repository.model_state import ModelVersion
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.sequence.sequence_batcher import SequenceBatcher

WHERE = "the reference in the request"


def drift_report(mv: ModelVersion) -> dict[str, Any]:
    monitor = mv.drift
    doc: dict[str, Any] = {"model": mv.name, "version": mv.version}
    if monitor is None:
        return doc | {"state": "off", "tensors": []}
    opts = monitor.options
    reference = monitor.reference
    if reference is not None:
        state = "monitoring"
    else:
        state = "collecting_reference" if monitor.collecting else "no_reference"
    latest = monitor.latest
    tensors = []
    for name, ref in reference.tensors.items() if reference is not None else ():
        entry: dict[str, Any] = {
            "name": name,
            "io": ref.plan.io,
            "kind": ref.plan.kind,
            "reference_rows": ref.rows,
        }
        result = latest.get(name)
        if result is not None:
            entry |= _tensor_doc(result, ref.column_names)
        tensors.append(entry)
    return doc | {
        "state": state,
        "reference": None if reference is None else {"source": reference.source},
        "window": opts.window,
        "sample_rate": opts.sample_rate,
        "thresholds": {"p_value": opts.p_value_threshold, "psi": opts.psi_threshold},
        "rows_seen": monitor.rows_seen,
        "rows_skipped": monitor.rows_skipped,
        "samples": monitor.sampled,
        "samples_dropped": monitor.dropped,
        "sample_failures": monitor.failures,
        "cpu_seconds": round(monitor.cpu_s, 6),
        "drifting": any(t.alerting for r in latest.values() for t in r.tests.values()),
        "tensors": tensors,
    }


def _tensor_doc(result: TensorDrift, names: tuple[str, ...]) -> dict[str, Any]:
    columns = [
        {"column": names[i]}
        | {key: _finite(values[i]) for key, values in result.per_column.items()}
        for i in range(len(next(iter(result.per_column.values()), [])))
    ]
    return {
        "windows": result.windows,
        "window_rows": result.window_rows,
        "tests": {
            test: {
                "score": _finite(t.score),
                "p_value": None if t.p_value is None else _finite(t.p_value),
                "worst_column": names[t.worst_column] if names[0] != "class" else None,
                "alerting": t.alerting,
            }
            for test, t in result.tests.items()
        },
        "columns": columns,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def parse_npz_reference(mv: ModelVersion, body: bytes) -> Reference:
    """A reference from an .npz archive's bytes. Off the event loop: it sorts."""
    _need_scipy(mv.name)
    opts = mv.spec.drift
    plans = tensor_plans(mv.config, opts)
    try:
        return Reference(parse_reference(body, plans, opts, WHERE), "admin")
    except ReferenceError as exc:
        raise invalid(str(exc)) from None


def parse_json_reference(mv: ModelVersion, doc: dict[str, Any]) -> Reference:
    """`{"tensors": {"name": [[...], ...], ...}}`: rows of each tensor as JSON arrays."""
    _need_scipy(mv.name)
    raw = doc.get("tensors")
    if not isinstance(raw, dict) or not raw:
        raise invalid("'tensors' must be an object of tensor name -> rows (JSON arrays)")
    opts = mv.spec.drift
    plans = tensor_plans(mv.config, opts)
    arrays: dict[str, np.ndarray] = {}
    for name, rows in raw.items():
        if not isinstance(rows, list):
            raise invalid(f"'tensors.{name}' must be an array of rows")
        kind = plans[name].kind if name in plans else ""
        try:
            array = np.asarray(rows, dtype=str if kind == BYTES else None)
        except ValueError:
            array = np.empty(0, dtype=object)
        if array.dtype == object:
            raise invalid(f"'tensors.{name}': rows of different shapes")
        arrays[name] = array
    try:
        return Reference(reference_of(arrays, plans, opts, WHERE), "admin")
    except ReferenceError as exc:
        raise invalid(str(exc)) from None


def _need_scipy(name: str) -> None:
    try:
        need_scipy(name)
    except DriftSetupError as exc:
        raise invalid(str(exc)) from None


def install_reference(mv: ModelVersion, reference: Reference) -> dict[str, Any]:
    """On the event loop: the version monitors against `reference` from now on (a version
    that had no monitor gets one; the caller replaces an existing monitor's reference off
    the loop, since its thread may hold the lock for a window's test)."""
    monitor: DriftMonitor | None = mv.drift
    if monitor is None:
        batcher = mv.batcher
        if not isinstance(batcher, DynamicBatcher | SequenceBatcher):
            # An ensemble executes no batch of its own: its composing models do.
            raise invalid(
                f"model '{mv.name}' version {mv.version} executes no batches of its own (an "
                "ensemble): set drift references on its composing models"
            )
        monitor = new_monitor(mv.name, mv.version, mv.config, mv.spec.drift, reference)
        monitor.start()
        batcher.observe(monitor)
        mv.drift = monitor
    else:
        monitor.set_reference(reference)
    return drift_report(mv)
