"""The drift tests on fixed seeds: rows drawn from the reference stay below the alert
threshold over 20 windows; half a standard deviation of shift on 3 of 64 features crosses
it within 2 windows; predicted classes and BYTES lengths likewise; the statistics agree
with scipy's own two-sample tests."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from scipy import stats
from tritonclient.grpc import model_config_pb2 as mc

from inferd.monitoring.drift import chi_square, class_reference, columns_reference, ks_test, psi
from inferd.monitoring.drift_sampler import QUEUE_BATCHES, DriftMonitor
from inferd.monitoring.drift_spec import DriftOptions
from inferd.monitoring.reference import Reference, reference_of, tensor_plans
from inferd.scheduling.pending import Pending
from inferd.tensors.signature import BoundRequest

FEATURES = 64
SHIFTED = (5, 17, 40)


def config() -> mc.ModelConfig:
    c = mc.ModelConfig(name="m", max_batch_size=64)
    c.input.add(name="x", data_type=mc.TYPE_FP32, dims=[FEATURES])
    c.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    c.output.add(name="label", data_type=mc.TYPE_INT64, dims=[1])
    return c


OPTIONS = DriftOptions(class_outputs=frozenset({"label"}))


def rows(rng: np.random.Generator, n: int, shift: float = 0.0) -> dict[str, np.ndarray]:
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    x[:, SHIFTED] += shift
    words = rng.poisson(6 + 12 * shift, size=n) + 1
    text = np.array([[b"w " * int(k)] for k in words], dtype=object)
    labels = rng.choice(
        4, size=(n, 1), p=[0.4, 0.3, 0.2, 0.1] if not shift else [0.7, 0.1, 0.1, 0.1]
    )
    return {"x": x, "text": text, "label": labels.astype(np.int64)}


def monitor(seed: int = 0) -> DriftMonitor:
    rng = np.random.default_rng(seed)
    plans = tensor_plans(config(), OPTIONS)
    ref = rows(rng, 5000)
    ref["text"] = ref["text"].astype("S")
    tensors = reference_of(ref, plans, OPTIONS, "reference.npz")
    # Not started: the test feeds it on its own thread, window by window.
    return DriftMonitor("m", "1", plans, OPTIONS, True, Reference(tensors, "file"))


def feed(m: DriftMonitor, rng: np.random.Generator, n: int, shift: float = 0.0) -> None:
    for _ in range(n // 50):
        m.ingest(rows(rng, 50, shift), 50)


def test_rows_from_the_reference_stay_below_the_alert_threshold_over_20_windows() -> None:
    m, rng = monitor(), np.random.default_rng(1)
    seen = []
    for _ in range(20):
        before = m.latest.get("x")
        feed(m, rng, 1000 if before is None else 500)  # windows slide by half their size
        seen.append(m.latest)
    assert [latest["x"].windows for latest in seen] == list(range(1, 21))
    for latest in seen:
        for name, drift in latest.items():
            for test, result in drift.tests.items():
                assert not result.alerting, (name, test, result)
    ks = [latest["x"].tests["ks"] for latest in seen]
    assert max(r.score for r in ks) < 0.1
    assert min(r.p_value or 1 for r in ks) > OPTIONS.p_value_threshold


def test_half_a_standard_deviation_on_3_of_64_features_alerts_within_2_windows() -> None:
    m, rng = monitor(), np.random.default_rng(2)
    feed(m, rng, 1000)
    assert not m.latest["x"].tests["ks"].alerting
    start = m.latest["x"].windows
    while m.latest["x"].windows - start < 2 and not m.latest["x"].tests["ks"].alerting:
        feed(m, rng, 50, shift=0.5)
    drift = m.latest["x"]
    assert drift.tests["ks"].alerting, drift.tests
    assert drift.windows - start <= 2
    assert drift.tests["ks"].worst_column in SHIFTED
    # The per-column detail names the shifted columns as the drifting ones.
    d = np.array(drift.per_column["ks"])
    assert set(np.argsort(d)[-3:]) == set(SHIFTED)


def test_predicted_classes_and_text_lengths_drift_too() -> None:
    m, rng = monitor(), np.random.default_rng(3)
    feed(m, rng, 1000)
    assert not m.latest["label"].tests["chi2"].alerting
    assert not m.latest["text"].tests["ks"].alerting
    feed(m, rng, 1000, shift=0.5)
    assert m.latest["label"].tests["chi2"].alerting
    assert m.latest["text"].tests["ks"].alerting
    assert m.latest["text"].tests["psi"].alerting


def test_ks_agrees_with_scipy_ties_included() -> None:
    rng = np.random.default_rng(4)
    for ref, win in [
        (rng.normal(size=(700, 3)), rng.normal(0.2, 1, size=(300, 3))),
        (rng.integers(0, 5, size=(500, 2)).astype(float), rng.integers(0, 6, size=(250, 2))),
    ]:
        d, p = ks_test(columns_reference(ref), win)
        for j in range(ref.shape[1]):
            expected = stats.ks_2samp(ref[:, j], win[:, j], method="asymp")
            assert d[j] == pytest.approx(expected.statistic)
            # Kolmogorov's limit with Stephens' correction: close to the finite-sample one.
            assert p[j] == pytest.approx(expected.pvalue, rel=0.05, abs=1e-9)


def test_psi_is_small_for_the_same_distribution_and_grows_with_a_shift() -> None:
    rng = np.random.default_rng(5)
    ref = columns_reference(rng.normal(size=(5000, 1)))
    same = psi(ref, rng.normal(size=(1000, 1)))[0]
    shifted = psi(ref, rng.normal(1.0, 1, size=(1000, 1)))[0]
    assert same < 0.05 < 0.5 < shifted


def test_chi_square_counts_classes_the_reference_never_saw() -> None:
    ref = class_reference(np.repeat([0, 1, 2], 100))
    _, p_same, _ = chi_square(ref, np.repeat([0, 1, 2], 30))
    v, p_new, _ = chi_square(ref, np.repeat([0, 1, 2, 7], 30))
    assert p_same == pytest.approx(1.0)
    assert p_new < 1e-6 and v > 0.2


def test_a_full_queue_drops_and_counts_without_blocking() -> None:
    m = monitor()  # not started: nothing drains the queue
    batch: list[Any] = []
    results: list[Any] = []
    for _ in range(200):
        m.on_executed(batch, results)
    assert m.sampled == QUEUE_BATCHES and m.dropped == 200 - QUEUE_BATCHES


def test_first_k_rows_become_the_reference() -> None:
    options = DriftOptions(reference="first", first_rows=1000, class_outputs=frozenset({"label"}))
    m = DriftMonitor("m", "1", tensor_plans(config(), options), options, True, None)
    rng = np.random.default_rng(6)
    assert m.collecting
    feed(m, rng, 1000)
    assert m.reference is not None and m.reference.source == "first:1000"
    assert m.reference.tensors["x"].rows == 1000
    feed(m, rng, 1000)
    assert not m.latest["x"].tests["ks"].alerting
    feed(m, rng, 1000, shift=0.5)
    assert m.latest["x"].tests["ks"].alerting


def test_borrowed_inputs_are_copied_before_the_answer_reuses_their_memory() -> None:
    """Shared-memory inputs and the engine hop's slab are reused once a request is answered:
    a queued sample keeps copies of them, not views."""
    m = monitor()
    loop = asyncio.new_event_loop()
    try:
        slab = np.zeros((2, FEATURES), np.float32)
        own = np.ones((1, FEATURES), np.float32)

        def pending(inputs: dict[str, np.ndarray], borrowed: bool) -> Pending:
            request = BoundRequest(inputs, len(inputs["x"]), ((FEATURES,),), [], borrowed=borrowed)
            return Pending(request, loop.create_future())

        batch = [pending({"x": slab}, True), pending({"x": own}, False)]
        m.on_executed(batch, [{}, {}])
    finally:
        loop.close()
    slab[:] = 7.0  # the memory is reused by the next request
    item = m._queue.get_nowait()
    assert item is not None
    _, _, copies = item
    assert set(copies) == {0}  # only the borrowed request's inputs are copied
    assert (copies[0]["x"] == 0).all()
