"""`inferd optimize`'s rules on small arrays: how each output kind's drop is computed (an
embedding's cosine similarity and nearest-neighbour agreement), which candidate is eligible
and which wins, the version policy checks, the timing loop's counts, and how data is cut
into feeds."""

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


def test_embeddings_are_named_or_recognised_as_unit_vectors(mlp: OriginalModel) -> None:
    unit = _circle(0, 45, 200, 300)
    scaled = unit * 2
    reference = {"probabilities": scaled, "label": np.zeros((4, 1), np.int64)}
    assert acc.output_kinds(mlp, reference, [])["probabilities"] == "numeric"
    named = acc.output_kinds(mlp, reference, [], ["probabilities"])
    assert named["probabilities"] == "embedding"
    reference["probabilities"] = unit
    assert acc.output_kinds(mlp, reference, [])["probabilities"] == "embedding"
    # A model without batching: [1, d] per sample is one vector too.
    reference["probabilities"] = unit[:, np.newaxis, :]
    assert acc.output_kinds(mlp, reference, [])["probabilities"] == "embedding"
    # Probabilities stay class scores though a one-hot row has unit length.
    reference["probabilities"] = np.eye(4)
    assert acc.output_kinds(mlp, reference, [])["probabilities"] == "class"
    tokens = {"probabilities": np.ones((4, 3, 2)), "label": np.zeros((4, 1), np.int64)}
    with pytest.raises(OptimizeError, match=r"--embedding-output probabilities: the output is "
                       r"\[3, 2\] per sample; an embedding is one vector"):  # fmt: skip
        acc.output_kinds(mlp, tokens, [], ["probabilities"])
    with pytest.raises(OptimizeError, match="--embedding-output label: the output is not float"):
        acc.output_kinds(mlp, reference, [], ["label"])
    with pytest.raises(OptimizeError, match="--embedding-output e: mlp has no such output"):
        acc.output_kinds(mlp, reference, [], ["e"])


def _circle(*degrees: float) -> np.ndarray:
    radians = np.radians(degrees)
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


def test_embeddings_count_cosine_similarity_and_nearest_neighbour_agreement() -> None:
    """Unit vectors at 0, 10, 90 and 100 degrees: 0 and 1 are each other's nearest, 2 and 3
    too. The candidate turns sample 1 to 50 degrees: it stays sample 0's nearest, but its
    own nearest is now sample 2 (40 degrees away, against 50)."""
    original = _circle(0, 10, 90, 100)
    candidate = _circle(0, 50, 90, 100)
    assert acc.nearest_neighbours(original).tolist() == [1, 0, 3, 2]
    assert acc.nearest_neighbours(candidate).tolist() == [1, 2, 3, 2]
    [found] = acc.compare({"e": original}, {"e": candidate}, {"e": acc.EMBEDDING})
    figures = found.embedding
    assert figures is not None
    assert figures.cosine_min == pytest.approx(math.cos(math.radians(40)))
    assert figures.worst_sample == 1
    assert figures.cosine_mean == pytest.approx((3 + math.cos(math.radians(40))) / 4)
    assert figures.neighbours_agreeing == 3 and found.agreement == 0.75
    assert found.drop == pytest.approx(1 - math.cos(math.radians(40)))
    # Cosine, not distance: a vector scaled by 3 is the same embedding.
    [scaled] = acc.compare({"e": original}, {"e": original * 3}, {"e": acc.EMBEDDING})
    assert scaled.embedding is not None and scaled.embedding.cosine_min == pytest.approx(1.0)
    assert scaled.embedding.neighbour_agreement == 1.0


def test_the_nearest_neighbour_search_in_blocks_finds_what_a_full_search_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vectors = np.random.default_rng(3).standard_normal((50, 8))
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    monkeypatch.setattr(acc, "NEIGHBOUR_BLOCK", 7)  # 8 blocks, the last one short
    assert acc.nearest_neighbours(vectors).tolist() == np.argmax(similarity, axis=1).tolist()


def test_an_embedding_that_is_not_finite_or_zero_loses() -> None:
    original = _circle(0, 10, 90)
    broken = original.copy()
    broken[2] = np.nan
    [found] = acc.compare({"e": original}, {"e": broken}, {"e": acc.EMBEDDING})
    assert found.embedding is not None and not found.embedding.is_finite
    assert math.isinf(found.drop)
    zeroed = original.copy()
    zeroed[0] = 0.0  # a zero vector points nowhere: its cosine to the original's is 0
    [zero] = acc.compare({"e": original}, {"e": zeroed}, {"e": acc.EMBEDDING})
    assert zero.embedding is not None and zero.embedding.cosine_min == 0.0


def test_embeddings_take_no_part_in_the_accuracy_drop() -> None:
    values = np.array([[1.0, 2.0], [2.0, 2.0]])
    found = acc.compare(
        {"e": _circle(0, 90), "y": values},
        {"e": _circle(30, 90), "y": values * 1.1},
        {"e": acc.EMBEDDING, "y": acc.NUMERIC},
    )
    accuracy = acc.Accuracy(found)
    assert accuracy.drop == pytest.approx(0.1)  # y's; e lost 1 - cos(30 degrees) = 13%
    assert [o.name for o in accuracy.embeddings] == ["e"]
    only_embedding = acc.Accuracy([found[0]])
    assert not only_embedding.has_drop and only_embedding.drop == 0.0


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


def _embedding_outcome(name: str, p50_ms: float, cosines: list[float], agreeing: int) -> Outcome:
    outcome = Outcome(name, MEASURED, built=Built(name, Path(name), ONNX, ""))
    outcome.speed = _speed(p50_ms)
    worst = int(np.argmin(cosines))
    figures = acc.EmbeddingAgreement(len(cosines), cosines[worst], 0.0, worst, agreeing)
    output = acc.OutputAgreement(
        "embedding", acc.EMBEDDING, 0, 0, figures.neighbour_agreement, 1 - cosines[worst], figures
    )
    outcome.accuracy = acc.Accuracy([output])
    return outcome


def test_an_embedding_needs_the_cosine_similarity_and_the_neighbours_kept() -> None:
    original = _speed(1.0)
    rules = Rules(min_speedup=1.1)  # min_cosine 0.99, min_neighbour_agreement 95%
    kept = _embedding_outcome("kept", 0.5, [0.999] * 19 + [0.9905], agreeing=19)
    turned = _embedding_outcome("turned", 0.4, [0.999] * 19 + [0.98123], agreeing=20)
    shuffled = _embedding_outcome("shuffled", 0.3, [0.999] * 20, agreeing=18)
    almost = _embedding_outcome("almost", 0.2, [0.999] * 19 + [0.98999995], agreeing=20)
    for outcome in (kept, turned, shuffled, almost):
        judge(outcome, original, 8, rules, ONNX)
    assert kept.eligible
    assert turned.reason == (
        "cosine similarity of 'embedding' 0.9812 < 0.99 (min over 20 samples, the least at "
        "sample 19)"
    )
    assert shuffled.reason == (
        "nearest-neighbour agreement of 'embedding' 90.00% < 95.00% (18 of 20 queries)"
    )
    assert almost.reason.startswith("cosine similarity of 'embedding' 0.9899999 < 0.99")
    assert pick_winner([kept, turned, shuffled, almost]) is kept
    assert kept.reason == (
        "won: the fastest eligible candidate, 2.00x, cosine similarity of 'embedding' >= "
        "0.9905, nearest-neighbour agreement 95.00%"
    )
    lenient = Rules(min_speedup=1.1, min_cosine=0.98, min_neighbour_agreement=0.9)
    for outcome in (turned, shuffled):
        judge(outcome, original, 8, lenient, ONNX)
        assert outcome.eligible


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
    assert parse_share(text, "--min-neighbour-agreement") == pytest.approx(share)
    with pytest.raises(OptimizeError, match="--min-neighbour-agreement '101%': expected a share"):
        parse_share("101%", "--min-neighbour-agreement", "95%")


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
