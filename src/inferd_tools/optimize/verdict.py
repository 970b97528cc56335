"""Which candidates are eligible, which one wins, and why each other one lost."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferd_tools.optimize.accuracy import Accuracy
from inferd_tools.optimize.candidates import Built
from inferd_tools.optimize.measure import Speed
from inferd_tools.optimize.source import FORMAT_NAMES

MEASURED = "measured"
FAILED = "failed"


@dataclass(frozen=True)
class Rules:
    min_speedup: float = 1.1  # at the model's preferred batch, p50 against p50
    max_accuracy_drop: float = 0.01  # a share: 0.01 is one percentage point


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
    winner.reason = (
        f"won: the fastest eligible candidate, {winner.speedup:.2f}x, accuracy drop "
        f"{_percent(winner.accuracy.drop)}"
    )
    for other in eligible:
        if other is not winner:
            other.reason = (
                f"eligible, but slower than {winner.name} ({other.speedup:.2f}x against "
                f"{winner.speedup:.2f}x)"
            )
    return winner


def _percent(share: float) -> str:
    return "inf" if math.isinf(share) else f"{share * 100:.2f}%"


def _worst(accuracy: Accuracy) -> str:
    if accuracy.label_accuracy is not None and accuracy.original_label_accuracy is not None:
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
