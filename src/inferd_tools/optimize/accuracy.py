"""Accuracy against the original model: every output compared on the validation samples,
and with labels the accuracy delta.

Each output is one of four kinds, and what it is judged on follows from the kind:
- class scores (float outputs the config gives a `label_filename`, named by
  --class-output, or probabilities: in [0, 1] and summing to 1 over the last axis):
  drop = 1 - top-1 agreement with the original;
- integer outputs (class indexes, counts): drop = 1 - share of samples equal to the original;
- embeddings (float vectors named by --embedding-output, or of unit L2 length in every
  sample): the cosine similarity of each sample's vector to the original's (its minimum is
  gated by --min-cosine) and the nearest-neighbour agreement over the validation samples
  (gated by --min-neighbour-agreement); they take no part in the accuracy drop;
- other float outputs: drop = mean absolute error / mean absolute value of the original.
Without labels the candidate's drop is its worst non-embedding output's; with labels, it is
the label accuracy it lost (original's minus candidate's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from inferd_tools.optimize.data import Dataset
from inferd_tools.optimize.errors import OptimizeError
from inferd_tools.optimize.runners import Runner
from inferd_tools.optimize.source import OriginalModel

CLASS = "class"
EXACT = "exact"
NUMERIC = "numeric"
EMBEDDING = "embedding"
PROBABILITY_SUM_TOLERANCE = 1e-3
# An output whose every vector has an L2 norm within this of 1 is recognised as an
# embedding (float32 normalisation lands within ~1e-6; 1e-3 leaves room for FP16 graphs).
UNIT_NORM_TOLERANCE = 1e-3
# Queries per block of the nearest-neighbour search: a block's similarities to every sample
# are block x samples float64 (1024 x 10,000 samples: 80 MB).
NEIGHBOUR_BLOCK = 1024


class OutputsDifferError(Exception):
    """A candidate's outputs are not the original's (names, dtypes or shapes)."""


@dataclass(frozen=True)
class EmbeddingAgreement:
    """An embedding output's figures: per sample, the cosine similarity of the candidate's
    vector to the original's; and for each sample as a query, whether its nearest neighbour
    among the other samples (by cosine) is the same one under both models."""

    samples: int
    cosine_min: float  # NaN when a vector is NaN or infinite
    cosine_mean: float
    worst_sample: int  # the index of the sample with the least cosine similarity
    neighbours_agreeing: int  # queries whose nearest neighbour is the original's

    @property
    def neighbour_agreement(self) -> float:
        return self.neighbours_agreeing / self.samples if self.samples > 1 else math.nan

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.cosine_min)

    def to_json(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "cosine_min": self.cosine_min,
            "cosine_mean": self.cosine_mean,
            "worst_sample": self.worst_sample,
            "neighbour_agreement": self.neighbour_agreement,
            "neighbours_agreeing": self.neighbours_agreeing,
        }


@dataclass
class OutputAgreement:
    name: str
    kind: str  # CLASS, EXACT, EMBEDDING or NUMERIC
    max_abs_error: float
    mean_abs_error: float
    # CLASS: top-1 agreement; EXACT: equal samples; EMBEDDING: nearest-neighbour agreement;
    # NUMERIC: None
    agreement: float | None
    drop: float  # EMBEDDING: 1 - the least cosine similarity, outside the accuracy drop
    embedding: EmbeddingAgreement | None = None

    def to_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            "name": self.name,
            "kind": self.kind,
            "max_abs_error": self.max_abs_error,
            "mean_abs_error": self.mean_abs_error,
            "agreement": self.agreement,
            "drop": self.drop,
        }
        if self.embedding is not None:
            found["embedding"] = self.embedding.to_json()
        return found


@dataclass
class Accuracy:
    outputs: list[OutputAgreement]
    label_accuracy: float | None = None  # with labels: the candidate's
    original_label_accuracy: float | None = None

    @property
    def has_labels(self) -> bool:
        return self.label_accuracy is not None and self.original_label_accuracy is not None

    @property
    def dropping(self) -> list[OutputAgreement]:
        """The outputs the accuracy drop covers: every one but the embeddings."""
        return [o for o in self.outputs if o.kind != EMBEDDING]

    @property
    def has_drop(self) -> bool:
        """Whether the accuracy drop stands on anything (an embedding model has none)."""
        return self.has_labels or bool(self.dropping)

    @property
    def drop(self) -> float:
        if self.label_accuracy is not None and self.original_label_accuracy is not None:
            return self.original_label_accuracy - self.label_accuracy
        return max((o.drop for o in self.dropping), default=0.0)

    def worst(self) -> OutputAgreement | None:
        return max(self.dropping, key=lambda o: o.drop, default=None)

    @property
    def embeddings(self) -> list[OutputAgreement]:
        return [o for o in self.outputs if o.embedding is not None]

    def to_json(self) -> dict[str, object]:
        return {
            "drop": self.drop if self.has_drop else None,  # None: only embeddings, no drop
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
    model: OriginalModel,
    reference: dict[str, np.ndarray],
    class_outputs: list[str],
    embedding_outputs: list[str] | None = None,
) -> dict[str, str]:
    """Each output's kind, from the options first, then the config's label files, then the
    original's values: probabilities are class scores, unit vectors are embeddings."""
    embedding_outputs = embedding_outputs or []
    labelled = {o.name for o in model.config.output if o.label_filename}
    for option, names in (
        ("--class-output", class_outputs),
        ("--embedding-output", embedding_outputs),
    ):
        for name in names:
            if name not in reference:
                raise OptimizeError(
                    f"{option} {name}: {model.name} has no such output "
                    f"(outputs: {', '.join(reference)})"
                )
            if reference[name].dtype.kind != "f":
                raise OptimizeError(f"{option} {name}: the output is not floating point")
    for name in embedding_outputs:
        if not _one_vector_per_sample(reference[name]):
            raise OptimizeError(
                f"--embedding-output {name}: the output is {list(reference[name].shape[1:])} "
                "per sample; an embedding is one vector of at least 2 values per sample"
            )
    kinds = {}
    for name, value in reference.items():
        if value.dtype.kind in "biu":
            kinds[name] = EXACT
        elif name in class_outputs:
            kinds[name] = CLASS
        elif name in embedding_outputs:
            kinds[name] = EMBEDDING
        elif name in labelled or _probabilities(value):
            kinds[name] = CLASS
        elif _unit_vectors(value):
            kinds[name] = EMBEDDING
        else:
            kinds[name] = NUMERIC
    return kinds


def _one_vector_per_sample(value: np.ndarray) -> bool:
    """[samples, d], or [samples, 1, ..., d] (a model without batching), with d >= 2."""
    return value.ndim >= 2 and value.shape[-1] >= 2 and all(d == 1 for d in value.shape[1:-1])


def _unit_vectors(value: np.ndarray) -> bool:
    if value.dtype.kind != "f" or value.size == 0 or not _one_vector_per_sample(value):
        return False
    norms = np.linalg.norm(_vectors(value), axis=1)
    return bool(np.all(np.abs(norms - 1.0) <= UNIT_NORM_TOLERANCE))


def _vectors(value: np.ndarray) -> np.ndarray:
    """One float64 row per sample."""
    return value.reshape(len(value), -1).astype(np.float64)


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
        embedding: EmbeddingAgreement | None = None
        if kind == EMBEDDING:
            embedding = embedding_agreement(ref, got)
            agreement = embedding.neighbour_agreement
            drop = 1.0 - embedding.cosine_min
        elif kind == CLASS:
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
        found.append(OutputAgreement(name, kind, max_abs, mean_abs, agreement, drop, embedding))
    return found


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm; a zero row stays zero (its cosine to any row is 0)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: np.ndarray = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return unit


def nearest_neighbours(vectors: np.ndarray) -> np.ndarray:
    """For each row, the index of the most cosine-similar other row (ties: the lowest index).
    Needs at least 2 rows."""
    unit = unit_rows(vectors)
    found = np.empty(len(unit), np.int64)
    for start in range(0, len(unit), NEIGHBOUR_BLOCK):
        similarity = unit[start : start + NEIGHBOUR_BLOCK] @ unit.T
        rows = np.arange(len(similarity))
        similarity[rows, start + rows] = -np.inf  # a query is not its own neighbour
        found[start : start + len(similarity)] = np.argmax(similarity, axis=1)
    return found


def embedding_agreement(reference: np.ndarray, candidate: np.ndarray) -> EmbeddingAgreement:
    ref, got = _vectors(reference), _vectors(candidate)
    samples = len(ref)
    if not (np.isfinite(got).all() and np.isfinite(ref).all()):
        return EmbeddingAgreement(samples, math.nan, math.nan, 0, 0)
    cosines = np.sum(unit_rows(ref) * unit_rows(got), axis=1)
    worst = int(np.argmin(cosines)) if samples else 0
    agreeing = 0
    if samples > 1:
        agreeing = int(np.sum(nearest_neighbours(ref) == nearest_neighbours(got)))
    return EmbeddingAgreement(
        samples=samples,
        cosine_min=float(cosines[worst]) if samples else 1.0,
        cosine_mean=float(cosines.mean()) if samples else 1.0,
        worst_sample=worst,
        neighbours_agreeing=agreeing,
    )
