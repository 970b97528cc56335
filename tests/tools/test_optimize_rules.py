"""`inferd optimize`'s rules on small arrays: how each output kind's drop is computed, which
candidate is eligible and which wins, the version policy checks, the timing loop's counts,
and how data is cut into feeds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd_tools.optimize import accuracy as acc
from inferd_tools.optimize.candidates import Built
from inferd_tools.optimize.data import Dataset
from inferd_tools.optimize.errors import OptimizeError
from inferd_tools.optimize.main import parse_share
from inferd_tools.optimize.measure import Latency, MeasureSettings, Speed, time_calls
from inferd_tools.optimize.publish import check_canary_possible, policy_note, served_versions
from inferd_tools.optimize.source import ONNX, TORCHSCRIPT, OriginalModel, open_model
from inferd_tools.optimize.verdict import MEASURED, Outcome, Rules, judge, pick_winner
from tests.support.optimize_models import write_mlp

PROBABILITIES = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]])


def test_class_outputs_count_top1_agreement() -> None:
    flipped = PROBABILITIES.copy()
    flipped[2] = [0.5, 0.3, 0.2]  # one of four samples changes class
    kinds = {"p": acc.CLASS}
    [found] = acc.compare({"p": PROBABILITIES}, {"p": flipped}, kinds)
    assert found.agreement == 0.75 and found.drop == 0.25
    assert found.max_abs_error == pytest.approx(0.2)


def test_integer_outputs_count_equal_samples_and_floats_a_relative_error() -> None:
    labels = np.array([[0], [1], [2], [0]])
    changed = np.array([[0], [1], [1], [0]])
    values = np.array([[1.0, -3.0], [2.0, 2.0]])
    off = values + np.array([[0.1, -0.1], [0.1, 0.1]])
    found = acc.compare(
        {"label": labels, "y": values},
        {"label": changed, "y": off},
        {"label": acc.EXACT, "y": acc.NUMERIC},
    )
    by_name = {f.name: f for f in found}
    assert by_name["label"].drop == 0.25
    assert by_name["y"].agreement is None
    assert by_name["y"].drop == pytest.approx(0.1 / 2.0)  # mean error / mean |value|
    assert acc.Accuracy(found).drop == 0.25  # without labels: the worst output


def test_non_finite_outputs_lose_everything() -> None:
    [found] = acc.compare({"y": np.ones((2, 2))}, {"y": np.full((2, 2), np.nan)}, {"y": "numeric"})
    assert math.isinf(found.drop)


def test_with_labels_the_drop_is_the_label_accuracy_lost() -> None:
    accuracy = acc.Accuracy([], label_accuracy=0.9, original_label_accuracy=0.95)
    assert accuracy.drop == pytest.approx(0.05)
    assert acc.label_accuracy({"p": PROBABILITIES}, "p", np.array([0, 1, 2, 1])) == 0.75


def test_outputs_that_differ_are_refused() -> None:
    with pytest.raises(acc.OutputsDifferError, match="output 'p' is float16"):
        acc.compare({"p": PROBABILITIES}, {"p": PROBABILITIES.astype(np.float16)}, {"p": "class"})


@pytest.fixture
def mlp(tmp_path: Path) -> OriginalModel:
    write_mlp(tmp_path)
    return open_model(tmp_path, "mlp", None)


def test_output_kinds_from_values_and_options(mlp: OriginalModel) -> None:
    reference = {"probabilities": PROBABILITIES, "label": np.zeros((4, 1), np.int64)}
    assert acc.output_kinds(mlp, reference, []) == {"probabilities": "class", "label": "exact"}
    logits = {"probabilities": PROBABILITIES * 5 - 1, "label": np.zeros((4, 1), np.int64)}
    assert acc.output_kinds(mlp, logits, [])["probabilities"] == "numeric"
    assert acc.output_kinds(mlp, logits, ["probabilities"])["probabilities"] == "class"
    with pytest.raises(OptimizeError, match="--class-output label: the output is not floating"):
        acc.output_kinds(mlp, reference, ["label"])
    with pytest.raises(OptimizeError, match="--class-output nope: mlp has no such output"):
        acc.output_kinds(mlp, reference, ["nope"])


def _speed(p50_ms: float, batch: int = 8) -> Speed:
    return Speed(0.0, 1, {batch: Latency(batch, 10, p50_ms, p50_ms, 1.0)})


def _outcome(name: str, p50_ms: float, drop: float, fmt: str = ONNX) -> Outcome:
    outcome = Outcome(name, MEASURED, built=Built(name, Path(name), fmt, ""))
    outcome.speed = _speed(p50_ms)
    outcome.accuracy = acc.Accuracy([acc.OutputAgreement("p", "class", 0, 0, 1 - drop, drop)])
    return outcome


def test_eligibility_needs_the_speed_up_and_the_accuracy() -> None:
    original = _speed(1.0)
    rules = Rules(min_speedup=1.1, max_accuracy_drop=0.01)
    fast, slow, lossy = (
        _outcome("fast", 0.5, 0.0),
        _outcome("slow", 0.95, 0.0),
        _outcome("lossy", 0.2, 0.5),
    )
    other_format = _outcome("exported", 0.1, 0.0, fmt=TORCHSCRIPT)
    for outcome in (fast, slow, lossy, other_format):
        judge(outcome, original, 8, rules, ONNX)
    assert fast.eligible and fast.speedup == 2.0
    assert not slow.eligible and slow.reason == "speed-up 1.05x < 1.1x at batch 8"
    assert not lossy.eligible
    assert lossy.reason == "accuracy drop 50.00% > 1.00% (top-1 agreement of 'p' 50.00%)"
    assert not other_format.eligible and "cannot be a version of this ONNX" in other_format.reason


def test_the_fastest_eligible_candidate_wins_and_the_others_say_why_not() -> None:
    original = _speed(1.0)
    a, b = _outcome("a", 0.5, 0.0), _outcome("b", 0.25, 0.005)
    for outcome in (a, b):
        judge(outcome, original, 8, Rules(), ONNX)
    assert pick_winner([a, b]) is b
    assert (
        b.winner and b.reason == "won: the fastest eligible candidate, 4.00x, accuracy drop 0.50%"
    )
    assert a.reason == "eligible, but slower than b (2.00x against 4.00x)"
    slower = _outcome("slower", 2.0, 0.0)
    judge(slower, original, 8, Rules(min_speedup=0), ONNX)
    assert slower.eligible  # --min-speedup 0: any speed
    assert pick_winner([_outcome("unjudged", 0.1, 0.0)]) is None


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


@pytest.mark.parametrize(
    ("policy", "available", "served"),
    [
        ("", [1, 2, 3], [3]),
        ("version_policy: { latest { num_versions: 2 } }", [1, 2, 3], [2, 3]),
        ("version_policy: { all { } }", [1, 3], [1, 3]),
        ("version_policy: { specific { versions: [1, 3] } }", [1, 2, 3], [1, 3]),
    ],
)
def test_served_versions_follow_triton_policies(
    policy: str, available: list[int], served: list[int]
) -> None:
    assert served_versions(_config(policy), available) == served


def test_a_policy_that_would_not_serve_the_new_version_is_reported(mlp: OriginalModel) -> None:
    assert policy_note(mlp) == ""
    mlp.config.version_policy.specific.versions[:] = [1]
    assert "does not serve version 2" in policy_note(mlp)


def test_a_canary_needs_both_versions_served_and_the_automatic_rollback(
    mlp: OriginalModel,
) -> None:
    with pytest.raises(OptimizeError, match="would not serve version 1 beside"):
        check_canary_possible(mlp)
    mlp.config.version_policy.latest.num_versions = 2
    with pytest.raises(OptimizeError, match="does not turn on the automatic rollback"):
        check_canary_possible(mlp)
    mlp.config.parameters["canary_auto_rollback"].string_value = "true"
    check_canary_possible(mlp)


@pytest.mark.parametrize(("text", "share"), [("1%", 0.01), ("0.05", 0.05), ("100%", 1.0)])
def test_drop_limits_are_shares_or_percentages(text: str, share: float) -> None:
    assert parse_share(text) == pytest.approx(share)


def test_the_timing_loop_runs_past_the_duration_until_min_runs() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # every reading a millisecond later
        return now[0]

    calls: list[int] = []
    settings = MeasureSettings(duration_s=0.001, warmup_runs=3, min_runs=20)
    latency = time_calls(lambda: calls.append(1), 4, settings, clock)
    assert latency.runs == 20 and len(calls) == 23  # 3 warm-up calls are not timed
    assert latency.p50_ms == pytest.approx(1.0)
    assert latency.throughput == pytest.approx(20 * 4 / (now[0] - 0.001))


def test_data_is_fed_in_batches_or_one_sample_at_a_time() -> None:
    data = Dataset({"x": np.arange(10).reshape(5, 2)}, 5, "test", synthetic=False)
    assert [len(f["x"]) for f in data.batches(2, batched=True)] == [2, 2, 1]
    assert [f["x"].shape for f in data.batches(2, batched=False)] == [(2,)] * 5
    assert data.feed(7, batched=True)["x"][:, 0].tolist() == [0, 2, 4, 6, 8, 0, 2]
