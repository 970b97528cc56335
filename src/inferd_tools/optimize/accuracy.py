"""Accuracy against the original model: every output compared on the validation samples,
and with labels the accuracy delta.

Each output is one of three kinds, and its drop (the share it lost) follows from the kind:
- class scores (float outputs the config gives a `label_filename`, named by
  --class-output, or probabilities: in [0, 1] and summing to 1 over the last axis):
  drop = 1 - top-1 agreement with the original;
- integer outputs (class indexes, counts): drop = 1 - share of samples equal to the original;
- other float outputs: drop = mean absolute error / mean absolute value of the original.
Without labels the candidate's drop is its worst output's; with labels, it is the label
accuracy it lost (original's minus candidate's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferd_tools.optimize.data import Dataset
from inferd_tools.optimize.errors import OptimizeError
from inferd_tools.optimize.runners import Runner
from inferd_tools.optimize.source import OriginalModel

CLASS = "class"
EXACT = "exact"
NUMERIC = "numeric"
PROBABILITY_SUM_TOLERANCE = 1e-3


class OutputsDifferError(Exception):
    """A candidate's outputs are not the original's (names, dtypes or shapes)."""


@dataclass
class OutputAgreement:
    name: str
    kind: str  # CLASS, EXACT or NUMERIC
    max_abs_error: float
    mean_abs_error: float
    agreement: float | None  # CLASS: top-1 agreement; EXACT: equal samples; NUMERIC: None
    drop: float

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "max_abs_error": self.max_abs_error,
            "mean_abs_error": self.mean_abs_error,
            "agreement": self.agreement,
            "drop": self.drop,
        }


@dataclass
class Accuracy:
    outputs: list[OutputAgreement]
    label_accuracy: float | None = None  # with labels: the candidate's
    original_label_accuracy: float | None = None

    @property
    def drop(self) -> float:
        if self.label_accuracy is not None and self.original_label_accuracy is not None:
            return self.original_label_accuracy - self.label_accuracy
        return max((o.drop for o in self.outputs), default=0.0)

    def worst(self) -> OutputAgreement | None:
        return max(self.outputs, key=lambda o: o.drop, default=None)

    def to_json(self) -> dict[str, object]:
        return {
            "drop": self.drop,
            "label_accuracy": self.label_accuracy,
            "original_label_accuracy": self.original_label_accuracy,
            "outputs": [o.to_json() for o in self.outputs],
        }


def collect(runner: Runner, model: OriginalModel, data: Dataset) -> dict[str, np.ndarray]:
    """Every output over every sample, with a leading axis of samples."""
    parts: dict[str, list[np.ndarray]] = {}
    for feed in data.batches(max(1, model.max_batch_size), model.batched):
        for name, value in runner.run(feed).items():
            parts.setdefault(name, []).append(value if model.batched else value[np.newaxis])
    return {name: np.concatenate(values) for name, values in parts.items()}


def output_kinds(
    model: OriginalModel, reference: dict[str, np.ndarray], class_outputs: list[str]
) -> dict[str, str]:
    labelled = {o.name for o in model.config.output if o.label_filename}
    kinds = {}
    for name, value in reference.items():
        if value.dtype.kind in "biu":
            kinds[name] = EXACT
        elif name in class_outputs or name in labelled or _probabilities(value):
            kinds[name] = CLASS
        else:
            kinds[name] = NUMERIC
    for name in class_outputs:
        if name not in reference:
            raise OptimizeError(
                f"--class-output {name}: {model.name} has no such output "
                f"(outputs: {', '.join(reference)})"
            )
        if kinds[name] != CLASS:
            raise OptimizeError(f"--class-output {name}: the output is not floating point")
    return kinds


def _probabilities(value: np.ndarray) -> bool:
    if value.dtype.kind != "f" or value.ndim < 2 or value.shape[-1] < 2 or value.size == 0:
        return False
    as64 = value.astype(np.float64)
    if as64.min() < 0 or as64.max() > 1:
        return False
    return bool(np.all(np.abs(as64.sum(axis=-1) - 1.0) <= PROBABILITY_SUM_TOLERANCE))


def label_output(kinds: dict[str, str], class_outputs: list[str]) -> str:
    """The output labels are checked against: the first --class-output, else the first
    class output."""
    if class_outputs:
        return class_outputs[0]
    for name, kind in kinds.items():
        if kind == CLASS:
            return name
    raise OptimizeError(
        "--labels: the model has no class output to check them against; name one with "
        "--class-output"
    )


def label_accuracy(outputs: dict[str, np.ndarray], name: str, labels: np.ndarray) -> float:
    scores = outputs[name]
    if scores.ndim != 2:
        raise OptimizeError(
            f"--labels: output '{name}' has per-sample shape {list(scores.shape[1:])}; labels "
            "need one score vector per sample"
        )
    return float(np.mean(np.argmax(scores, axis=-1) == labels))


def compare(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], kinds: dict[str, str]
) -> list[OutputAgreement]:
    if set(candidate) != set(reference):
        raise OutputsDifferError(
            f"outputs {sorted(candidate)}, the original's are {sorted(reference)}"
        )
    found = []
    for name, ref in reference.items():
        got = candidate[name]
        if got.shape != ref.shape or got.dtype != ref.dtype:
            raise OutputsDifferError(
                f"output '{name}' is {got.dtype} {list(got.shape)}, the original's "
                f"{ref.dtype} {list(ref.shape)}"
            )
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        mean_abs = float(diff.mean()) if diff.size else 0.0
        kind = kinds[name]
        agreement: float | None = None
        if kind == CLASS:
            agreement = float(np.mean(np.argmax(got, axis=-1) == np.argmax(ref, axis=-1)))
            drop = 1.0 - agreement
        elif kind == EXACT:
            per_sample = (got == ref).reshape(len(ref), -1).all(axis=1)
            agreement = float(per_sample.mean()) if len(ref) else 1.0
            drop = 1.0 - agreement
        else:
            scale = float(np.abs(ref.astype(np.float64)).mean()) if ref.size else 0.0
            drop = mean_abs / scale if scale > 0 else mean_abs
        if not np.isfinite(drop) or not np.isfinite(max_abs):  # NaN or inf: nothing kept
            drop = float("inf")
        found.append(OutputAgreement(name, kind, max_abs, mean_abs, agreement, drop))
    return found
