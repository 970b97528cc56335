"""Which candidates are eligible, which one wins, and why each other one lost."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferd_tools.optimize.accuracy import Accuracy, OutputAgreement
from inferd_tools.optimize.candidates import Built
from inferd_tools.optimize.measure import Speed
from inferd_tools.optimize.source import FORMAT_NAMES

MEASURED = "measured"
FAILED = "failed"


@dataclass(frozen=True)
class Rules:
    min_speedup: float = 1.1  # at the model's preferred batch, p50 against p50
    max_accuracy_drop: float = 0.01  # a share: 0.01 is one percentage point
    # Embedding outputs: the least cosine similarity of any sample's vector to the original's,
    # and the share of queries whose nearest neighbour stays the original's (docs/optimize.md).
    min_cosine: float = 0.99
    min_neighbour_agreement: float = 0.95


@dataclass
class Outcome:
    name: str
    status: str  # MEASURED or FAILED (to build, to load, to run, or outputs that differ)
    reason: str = ""  # why it failed, lost or won
    description: str = ""
    built: Built | None = None
    speed: Speed | None = None
    accuracy: Accuracy | None = None
    speedup: float = math.nan  # original p50 / candidate p50 at the preferred batch
    eligible: bool = False
    winner: bool = False


def speedup(original: Speed, candidate: Speed, batch: int) -> float:
    ours, theirs = original.latency[batch].p50_ms, candidate.latency[batch].p50_ms
    return ours / theirs if theirs > 0 else math.inf


def judge(
    outcome: Outcome, original: Speed, batch: int, rules: Rules, publishable_format: str
) -> None:
    """Set speedup, eligible and the reason of a measured candidate."""
    if outcome.status != MEASURED or outcome.speed is None or outcome.accuracy is None:
        return
    outcome.speedup = speedup(original, outcome.speed, batch)
    drop = outcome.accuracy.drop
    reasons = []
    if not outcome.speedup >= rules.min_speedup:
        reasons.append(f"speed-up {outcome.speedup:.2f}x < {rules.min_speedup:g}x at batch {batch}")
    if not drop <= rules.max_accuracy_drop:
        reasons.append(
            f"accuracy drop {_percent(drop)} > {_percent(rules.max_accuracy_drop)}"
            + _worst(outcome.accuracy)
        )
    for output in outcome.accuracy.embeddings:
        reasons += embedding_reasons(output, rules)
    if outcome.built is not None and outcome.built.format != publishable_format:
        reasons.append(
            f"its {FORMAT_NAMES[outcome.built.format]} file cannot be a version of this "
            f"{FORMAT_NAMES[publishable_format]} model (one config serves one backend); serve "
            "it as a model of its own"
        )
    outcome.eligible = not reasons
    outcome.reason = "; ".join(reasons)


def pick_winner(outcomes: list[Outcome]) -> Outcome | None:
    """The eligible candidate with the largest speed-up; the others' reasons say why not."""
    eligible = [o for o in outcomes if o.eligible]
    if not eligible:
        return None
    winner = max(eligible, key=lambda o: o.speedup)
    winner.winner = True
    assert winner.accuracy is not None
    winner.reason = f"won: the fastest eligible candidate, {winner.speedup:.2f}x, " + ", ".join(
        _figures(winner.accuracy)
    )
    for other in eligible:
        if other is not winner:
            other.reason = (
                f"eligible, but slower than {winner.name} ({other.speedup:.2f}x against "
                f"{winner.speedup:.2f}x)"
            )
    return winner


def embedding_reasons(output: OutputAgreement, rules: Rules) -> list[str]:
    """Why an embedding output keeps its candidate from being eligible (none: it may be)."""
    found = output.embedding
    assert found is not None
    if not found.is_finite:
        return [f"embedding '{output.name}' has NaN or infinite values"]
    reasons = []
    if not found.cosine_min >= rules.min_cosine:
        reasons.append(
            f"cosine similarity of '{output.name}' {_cosine(found.cosine_min, rules.min_cosine)} "
            f"< {rules.min_cosine:g} "
            f"(min over {found.samples} samples, the least at sample {found.worst_sample})"
        )
    if not found.neighbour_agreement >= rules.min_neighbour_agreement:
        reasons.append(
            f"nearest-neighbour agreement of '{output.name}' "
            f"{_percent(found.neighbour_agreement)} < {_percent(rules.min_neighbour_agreement)} "
            f"({found.neighbours_agreeing} of {found.samples} queries)"
        )
    return reasons


def _cosine(value: float, bound: float) -> str:
    """Four decimals, more where four would round up to the bound it is under."""
    for digits in range(4, 13):
        text = f"{value:.{digits}f}"
        if float(text) < bound:
            return text
    return repr(value)


def _figures(accuracy: Accuracy) -> list[str]:
    """What a winner was judged on: its accuracy drop, each embedding's figures."""
    found = [f"accuracy drop {_percent(accuracy.drop)}"] if accuracy.has_drop else []
    for output in accuracy.embeddings:
        assert output.embedding is not None
        found.append(
            f"cosine similarity of '{output.name}' >= {output.embedding.cosine_min:.4f}, "
            f"nearest-neighbour agreement {_percent(output.embedding.neighbour_agreement)}"
        )
    return found


def _percent(share: float) -> str:
    return "inf" if math.isinf(share) else f"{share * 100:.2f}%"


def _worst(accuracy: Accuracy) -> str:
    if accuracy.has_labels:
        assert accuracy.label_accuracy is not None
        assert accuracy.original_label_accuracy is not None
        return (
            f" (label accuracy {_percent(accuracy.label_accuracy)} against the original's "
            f"{_percent(accuracy.original_label_accuracy)})"
        )
    worst = accuracy.worst()
    if worst is None:
        return ""
    if worst.agreement is not None:
        what = "top-1 agreement" if worst.kind == "class" else "equal samples"
        return f" ({what} of '{worst.name}' {_percent(worst.agreement)})"
    return f" (relative mean error of '{worst.name}')"
