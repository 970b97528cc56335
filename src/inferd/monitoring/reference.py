"""A model version's reference distributions: read from `<version>/reference.npz`, set
through the admin endpoint, or built from the first rows served; checked against the
model's config, then prepared once for the drift tests (docs/monitoring.md).

The features a test sees of a tensor, for the reference and the live rows alike:
numeric tensors, each row flattened into columns (the first `drift_max_columns`); BYTES
tensors, each element's length in bytes and its whitespace-separated token count;
class outputs (`drift_class_outputs`), each row's predicted class: the argmax of a row of
several values (scores), else its one value rounded (a class id, or a sigmoid's 0/1).
"""

from __future__ import annotations

import io
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.monitoring.drift import (
    ClassReference,
    ColumnsReference,
    class_reference,
    columns_reference,
)
from inferd.monitoring.drift_spec import DriftOptions

REFERENCE_FILE = "reference.npz"
MIN_ROWS = 10
NUMERIC, BYTES, CLASSES = "numeric", "bytes", "classes"
BYTES_COLUMNS = ("length", "tokens")


class ReferenceError(ValueError):
    """A reference that does not fit the model; the message names the tensor and why."""


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """How one tensor of the model is turned into features."""

    name: str
    io: str  # "input" or "output"
    kind: str  # NUMERIC, BYTES or CLASSES
    values_per_row: int | None  # None: variable dims


@dataclass(frozen=True, slots=True)
class TensorReference:
    plan: TensorPlan
    columns: ColumnsReference | None  # NUMERIC and BYTES
    classes: ClassReference | None  # CLASSES
    column_names: tuple[str, ...]

    @property
    def rows(self) -> int:
        return self.columns.rows if self.columns is not None else self.classes.rows  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Reference:
    tensors: dict[str, TensorReference]
    source: str  # "file", "first:K", "admin"


def tensor_plans(config: mc.ModelConfig, options: DriftOptions) -> dict[str, TensorPlan]:
    plans: dict[str, TensorPlan] = {}
    for io_kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            size = None if any(d < 0 for d in dims) else math.prod(dims)
            if t.name in options.class_outputs:
                kind = CLASSES
            elif t.data_type == mc.TYPE_STRING:
                kind = BYTES
            else:
                kind = NUMERIC
            plans[t.name] = TensorPlan(t.name, io_kind, kind, size)
    return plans


def features(plan: TensorPlan, array: np.ndarray, rows: int, max_columns: int) -> np.ndarray:
    """The tensor's features, (rows, columns) float64 (classes: (rows,) int64). `rows`: the
    rows the array holds (1 for an unbatched model's tensor)."""
    if plan.kind == BYTES:
        texts = [bytes(v) if not isinstance(v, str) else v.encode() for v in array.ravel()]
        out = np.empty((len(texts), 2))
        out[:, 0] = [len(t) for t in texts]
        out[:, 1] = [len(t.split()) for t in texts]
        return out
    flat = array.reshape(rows, -1)
    if plan.kind == CLASSES:
        if flat.shape[1] > 1:  # per-class scores: the predicted class is the largest
            return np.asarray(flat.argmax(axis=1), np.int64)
        # One value per row: a class id (a float one rounded: a sigmoid's 0/1 at 0.5).
        return np.asarray(np.rint(flat[:, 0]), np.int64)
    return flat[:, :max_columns].astype(np.float64)


def prepare(plan: TensorPlan, feats: np.ndarray) -> TensorReference:
    """The reference of one tensor from its features (from a file or served rows)."""
    if plan.kind == CLASSES:
        return TensorReference(plan, None, class_reference(feats), ("class",))
    names = BYTES_COLUMNS if plan.kind == BYTES else tuple(str(i) for i in range(feats.shape[1]))
    return TensorReference(plan, columns_reference(feats), None, names)


def read_reference_file(
    path: Path, plans: dict[str, TensorPlan], options: DriftOptions, where: str
) -> Reference:
    """`where` names the file in errors (`model/1/reference.npz`)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReferenceError(f"{where}: cannot be read: {exc.strerror}") from None
    return Reference(parse_reference(data, plans, options, where), "file")


def parse_reference(
    data: bytes, plans: dict[str, TensorPlan], options: DriftOptions, where: str
) -> dict[str, TensorReference]:
    """An .npz archive's bytes: one array per input (every input) and optionally per
    output, rows first."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        text = str(exc)
        if "allow_pickle" in text:
            text = "it holds object arrays; save strings as np.array(texts, dtype='S')"
        raise ReferenceError(f"{where}: not a readable .npz archive ({text})") from None
    return reference_of(arrays, plans, options, where)


def reference_of(
    arrays: dict[str, np.ndarray],
    plans: dict[str, TensorPlan],
    options: DriftOptions,
    where: str,
) -> dict[str, TensorReference]:
    """Checks each array against its tensor's plan and prepares it."""
    for name in sorted(set(arrays) - set(plans)):
        raise ReferenceError(f"{where}: '{name}' is not an input or output of the model")
    for name, plan in plans.items():
        if plan.io == "input" and name not in arrays:
            raise ReferenceError(f"{where}: input '{name}' is missing (every input needs rows)")
    out: dict[str, TensorReference] = {}
    for name, array in arrays.items():
        plan = plans[name]
        what = f"{where}: '{name}'"
        if array.ndim == 0 or array.shape[0] < MIN_ROWS:
            rows = array.shape[0] if array.ndim else 0
            raise ReferenceError(f"{what} has {rows} rows; a reference needs {MIN_ROWS} or more")
        if plan.kind == BYTES:
            if array.dtype.kind not in "SU":
                raise ReferenceError(
                    f"{what} is a BYTES tensor: its rows must be bytes or str "
                    f"(dtype 'S' or 'U'), got {array.dtype}"
                )
        elif array.dtype.kind not in "biuf":
            raise ReferenceError(f"{what} is not numeric (dtype {array.dtype})")
        else:
            per_row = math.prod(array.shape[1:])
            if plan.values_per_row is not None and per_row != plan.values_per_row:
                raise ReferenceError(
                    f"{what} has {per_row} values per row; the model's config gives it "
                    f"{plan.values_per_row} (wrong column count)"
                )
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise ReferenceError(f"{what} holds NaN or infinite values")
        out[name] = prepare(plan, features(plan, array, array.shape[0], options.max_columns))
    return out


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz archive of `arrays` (tests and tools write references with it)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()
