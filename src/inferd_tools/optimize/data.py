"""Calibration and validation inputs: `.npz` files (one array per input, a leading axis of
samples), checked against the model's signature, or synthetic inputs from the signature."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd_tools.optimize.errors import OptimizeError
from inferd_tools.optimize.source import OriginalModel, TensorSpec

SYNTHETIC_ROWS = 256
# Integer inputs are often indexes (token ids, categories): small values stay in range.
SYNTHETIC_INT_HIGH = 16


@dataclass
class Dataset:
    arrays: dict[str, np.ndarray]  # input name -> array with a leading axis of samples
    rows: int
    source: str  # what the report says the data was
    synthetic: bool

    def batches(self, size: int, batched: bool) -> Iterator[dict[str, np.ndarray]]:
        """Feeds of up to `size` rows for a batching model; one sample each otherwise."""
        step = size if batched else 1
        for start in range(0, self.rows, step):
            if batched:
                yield {k: a[start : start + step] for k, a in self.arrays.items()}
            else:
                yield {k: a[start] for k, a in self.arrays.items()}

    def feed(self, batch: int, batched: bool) -> dict[str, np.ndarray]:
        """One feed of `batch` rows (rows repeat when the data has fewer), for timing."""
        if not batched:
            return {k: np.ascontiguousarray(a[0]) for k, a in self.arrays.items()}
        index = np.arange(batch) % self.rows
        return {k: np.ascontiguousarray(a[index]) for k, a in self.arrays.items()}


def load_inputs(path: Path, option: str, model: OriginalModel) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as e:
        raise OptimizeError(f"{option} {path}: cannot read it as .npz: {e}") from None
    where = f"{option} {path}"
    expected = {t.name: t for t in model.inputs}
    unknown = sorted(set(arrays) - set(expected))
    if unknown:
        raise OptimizeError(
            f"{where}: array '{unknown[0]}' is not an input of {model.name} "
            f"(inputs: {', '.join(expected)})"
        )
    missing = [name for name in expected if name not in arrays]
    if missing:
        raise OptimizeError(f"{where}: no array for input '{missing[0]}'")
    rows = {name: _checked(where, expected[name], a) for name, a in arrays.items()}
    counts = sorted({len(a) for a in rows.values()})
    if len(counts) > 1:
        raise OptimizeError(
            f"{where}: the arrays hold different numbers of samples "
            f"({', '.join(f'{k}: {len(a)}' for k, a in rows.items())})"
        )
    if counts[0] == 0:
        raise OptimizeError(f"{where}: the arrays hold no samples")
    return Dataset(rows, counts[0], f"{path} ({counts[0]} samples)", synthetic=False)


def _checked(where: str, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    field = f"{where}: array '{spec.name}'"
    wanted = ["N", *(str(d) if d > 0 else "*" for d in spec.dims)]
    shape_text = f"expected shape [{', '.join(wanted)}] (N samples, then the model's dims)"
    if array.ndim != len(spec.dims) + 1:
        raise OptimizeError(f"{field}: shape {list(array.shape)}, {shape_text}")
    for axis, (got, want) in enumerate(zip(array.shape[1:], spec.dims, strict=True), 1):
        if want > 0 and got != want:
            raise OptimizeError(
                f"{field}: shape {list(array.shape)}, {shape_text}; dimension {axis} is {got}"
            )
    kind_ok = array.dtype.kind == spec.dtype.kind or (
        spec.dtype.kind in "iu" and array.dtype.kind in "iu"
    )
    if not kind_ok or not np.can_cast(array.dtype, spec.dtype, "same_kind"):
        raise OptimizeError(f"{field}: dtype {array.dtype}, the input is {spec.dtype}")
    return np.ascontiguousarray(array.astype(spec.dtype, copy=False))


def synthetic_inputs(model: OriginalModel, rows: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in model.inputs:
        if any(d <= 0 for d in spec.dims):
            tokens = (
                " (token ids: the tokenised sentences padded to one length, with their "
                "attention mask; docs/optimize.md, Embedding models)"
                if spec.dtype.kind in "iu"
                else ""
            )
            raise OptimizeError(
                f"{model.name}: input '{spec.name}' has a variable dimension (dims "
                f"{list(spec.dims)}), so no synthetic input can be made: give --validation "
                f"(and --calibration) data, whose arrays fix it{tokens}"
            )
        shape = (rows, *spec.dims)
        if spec.dtype.kind == "f":
            arrays[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            arrays[spec.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            arrays[spec.name] = rng.integers(0, SYNTHETIC_INT_HIGH, shape).astype(spec.dtype)
    source = f"synthetic ({rows} samples from the signature, seed {seed})"
    return Dataset(arrays, rows, source, synthetic=True)


def integer_inputs(model: OriginalModel) -> list[str]:
    """The inputs synthetic data fills with small random integers (token ids, categories)."""
    return [spec.name for spec in model.inputs if spec.dtype.kind in "iu"]


def load_labels(path: Path, rows: int) -> np.ndarray:
    """One integer class per validation sample: `.npy`, or `.npz` holding one array."""
    where = f"--labels {path}"
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise OptimizeError(f"{where}: cannot read it as .npy or .npz: {e}") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            if len(loaded.files) != 1:
                raise OptimizeError(f"{where}: expected one array, found {len(loaded.files)}")
            labels = loaded[loaded.files[0]]
    else:
        labels = loaded
    if labels.dtype.kind not in "iu":
        raise OptimizeError(f"{where}: labels must be integers (class indexes), got {labels.dtype}")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.shape != (rows,):
        raise OptimizeError(
            f"{where}: shape {list(labels.shape)}, expected [{rows}]: one class per "
            "validation sample"
        )
    return labels.astype(np.int64)
