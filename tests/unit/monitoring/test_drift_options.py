"""The drift_* config fields do what they say, each through the real path from a model's
config: `read_drift_options` -> `new_monitor` -> the monitor's sampling and tests, read
back from its counters and from `drift_report` (what GET .../drift answers)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.dataplane.drift_api import drift_report
from inferd.monitoring.drift_sampler import DriftMonitor
from inferd.monitoring.drift_setup import new_monitor
from inferd.monitoring.drift_spec import read_drift_options
from inferd.monitoring.reference import Reference, reference_of, tensor_plans
from inferd.repository.model_state import ModelVersion

FEATURES = 64
SHIFTED = (5, 17, 40)


def model_config(**parameters: str) -> mc.ModelConfig:
    c = mc.ModelConfig(name="m", max_batch_size=64)
    c.input.add(name="x", data_type=mc.TYPE_FP32, dims=[FEATURES])
    c.output.add(name="label", data_type=mc.TYPE_INT64, dims=[1])
    for key, value in {"drift_class_outputs": "label", **parameters}.items():
        c.parameters[key].string_value = value
    return c


def rows(rng: np.random.Generator, n: int, shift: float = 0.0) -> dict[str, np.ndarray]:
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    x[:, SHIFTED] += shift
    p = [0.4, 0.3, 0.2, 0.1]
    s = min(shift, 0.3)  # more probability on class 0
    q = [0.4 + s, 0.3 - s / 2, 0.2 - s / 2, 0.1]
    labels = rng.choice(4, size=(n, 1), p=q if shift else p)
    return {"x": x, "label": labels.astype(np.int64)}


def monitor_of(**parameters: str) -> DriftMonitor:
    """The monitor a model with these parameters gets at load, its reference as a
    reference.npz of 5,000 rows (seed 0) would give it. Not started: the test feeds it."""
    config = model_config(**parameters)
    options = read_drift_options(config)
    plans = tensor_plans(config, options)
    tensors = reference_of(rows(np.random.default_rng(0), 5000), plans, options, "reference.npz")
    return new_monitor("m", "1", config, options, Reference(tensors, "file"))


def feed(m: DriftMonitor, seed: int, n: int, shift: float = 0.0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n // 50):
        m.ingest(rows(rng, 50, shift), 50)


def report(m: DriftMonitor) -> dict[str, Any]:
    mv: Any = ModelVersion.__new__(ModelVersion)  # the report reads these three only
    mv.name, mv.version, mv.drift = "m", "1", m
    return drift_report(mv)


def offered(m: DriftMonitor) -> int:
    """Batches that passed the sampling coin flip: queued or dropped (the queue is full
    after 8, since nothing drains it), from the monitor's own counters."""
    return m.sampled + m.dropped


def test_drift_sample_rate_samples_that_share_of_executed_batches() -> None:
    batches = 20_000
    m = monitor_of(drift_sample_rate="0.1")
    assert m.options.sample_rate == 0.1
    for _ in range(batches):
        m.on_executed([], [])
    # Binomial(20000, 0.1): mean 2000, sd 42.4; outside 5.5 sd with probability < 1e-7.
    sd = math.sqrt(batches * 0.1 * 0.9)
    assert abs(offered(m) - batches * 0.1) < 5.5 * sd, offered(m)

    every = monitor_of()  # the default: every batch
    for _ in range(1000):
        every.on_executed([], [])
    assert offered(every) == 1000

    never = monitor_of(drift_sample_rate="0")
    for _ in range(1000):
        never.on_executed([], [])
    assert offered(never) == 0


def test_drift_max_columns_limits_the_columns_tested() -> None:
    capped, whole = monitor_of(drift_max_columns="8"), monitor_of()
    for m in (capped, whole):
        feed(m, 1, 1000)
        feed(m, 2, 1000, shift=0.5)  # columns 5, 17 and 40 shifted
    doc = report(capped)
    (x,) = [t for t in doc["tensors"] if t["name"] == "x"]
    assert len(x["columns"]) == 8 and capped.reference is not None
    assert capped.reference.tensors["x"].columns.columns == 8  # type: ignore[union-attr]
    assert [c["column"] for c in x["columns"]] == [str(i) for i in range(8)]
    assert x["tests"]["ks"]["worst_column"] == "5"  # the only shifted column tested
    (whole_x,) = [t for t in report(whole)["tensors"] if t["name"] == "x"]
    assert len(whole_x["columns"]) == FEATURES

    # Only column 40 shifted: past the cap, so the capped monitor does not see it.
    rng = np.random.default_rng(3)
    for m in (capped, whole):
        for _ in range(20):
            batch = rows(rng, 50)
            batch["x"][:, 40] += 1.0
            m.ingest(batch, 50)
    assert whole.latest["x"].tests["ks"].alerting
    assert whole.latest["x"].tests["ks"].worst_column == 40
    assert not capped.latest["x"].tests["ks"].alerting


def test_drift_p_value_threshold_decides_ks_and_chi2_alerting() -> None:
    strict = monitor_of(drift_p_value_threshold="1e-9")
    loose = monitor_of(drift_p_value_threshold="0.1")
    for m in (strict, loose):
        feed(m, 4, 1000, shift=0.1)  # the same rows: a small shift, one window
    ks = [m.latest["x"].tests["ks"] for m in (strict, loose)]
    chi2 = [m.latest["label"].tests["chi2"] for m in (strict, loose)]
    # The same window, the same p-values: only the threshold differs.
    assert ks[0].p_value == ks[1].p_value and chi2[0].p_value == chi2[1].p_value
    for strict_test, loose_test in (ks, chi2):
        assert strict_test.p_value is not None and 1e-9 < strict_test.p_value < 0.1
        assert not strict_test.alerting and loose_test.alerting
    assert report(loose)["drifting"] and not report(strict)["drifting"]


def test_drift_psi_threshold_decides_psi_alerting() -> None:
    low, high = monitor_of(drift_psi_threshold="0.05"), monitor_of(drift_psi_threshold="0.5")
    for m in (low, high):
        feed(m, 5, 1000, shift=0.3)
    tests = [m.latest["x"].tests["psi"] for m in (low, high)]
    assert tests[0].score == tests[1].score and 0.05 < tests[0].score < 0.5
    assert tests[0].alerting and not tests[1].alerting
    (x,) = [t for t in report(high)["tensors"] if t["name"] == "x"]
    assert x["tests"]["psi"]["alerting"] is False
    assert report(high)["thresholds"] == {"p_value": 0.001, "psi": 0.5}
