"""Triton's classification extension: an output's top classes instead of its tensor.

A requested output whose parameters carry `classification: k` (HTTP JSON; over gRPC the
`classification` int64 parameter, tritonclient's `InferRequestedOutput(name, class_count=k)`)
comes back as BYTES of shape [rows, k] for a batching model, [k] otherwise: per row the k
highest values, highest first, each as "<value>:<index>[:<label>]". The label is line
<index> of the output's `label_filename`, a file in the model's directory. As in Triton,
k is capped at the number of classes, values print as C's `%f` (floats) or `%d`
(integers), and an index without a (non-empty) label line has no label part.

What Triton leaves undefined is defined here: equal values rank by the lower index, and
an output must hold one dimension of scores per row (a 400 naming the output otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError
from inferd.config.model_paths import confined
from inferd.errors import invalid
from inferd.tensors.signature import ModelSignature
from inferd.types import InferRequest, Tensor

PARAMETER = "classification"
# Outputs that have no order to rank by.
_NOT_NUMERIC = frozenset({"BYTES", "BOOL"})


def requested_classes(request: InferRequest, signature: ModelSignature) -> dict[str, int] | None:
    """Output name -> k, for each requested output that asks for its top k classes;
    raises a 400 naming the output when it cannot. Call it after `signature.bind` (which
    names unknown outputs). None, at once for requests that ask for no output by name, when
    no output asks for classes."""
    requested = request.outputs
    if not requested:
        return None
    counts: dict[str, int] = {}
    for out in requested:
        k = out.parameters.get(PARAMETER)
        if k is None:
            continue
        where = f"output '{out.name}'"
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise invalid(
                f"{where}: parameter '{PARAMETER}' must be an integer >= 1 (how many "
                f"classes to return), got {k!r}"
            )
        spec = signature.outputs[out.name]
        if spec.datatype in _NOT_NUMERIC:
            raise invalid(
                f"{where}: '{PARAMETER}' needs numeric scores, but the output is {spec.datatype}"
            )
        if len(spec.dims) != 1:
            per = "per batch row" if signature.is_batched else "in all"
            raise invalid(
                f"{where}: '{PARAMETER}' needs one dimension of class scores {per}, but the "
                f"output's shape is {signature.metadata_shape(spec)}"
            )
        counts[out.name] = k
    return counts or None


def apply(
    tensors: list[Tensor], classes: Mapping[str, int], signature: ModelSignature
) -> list[Tensor]:
    """The response's outputs, those in `classes` (from `requested_classes`) as their
    top classes."""
    return [
        top_classes(t, classes[t.name], signature.labels.get(t.name, ()), signature.is_batched)
        if t.name in classes
        else t
        for t in tensors
    ]


def top_classes(tensor: Tensor, k: int, labels: Sequence[str], batched: bool) -> Tensor:
    """`tensor` (conformed: [rows, n] when `batched`, else [n]) as its top-k classes."""
    scores = tensor.data if batched else tensor.data.reshape(1, -1)
    n = scores.shape[1]
    k = min(k, n)
    # Highest first, equal values by the lower index: a stable ascending sort of each row
    # reversed, read backwards, gives exactly that order (as reversed-row positions).
    backwards = np.argsort(scores[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :k]
    order = (n - 1) - backwards
    values = np.take_along_axis(scores, order, axis=1)
    as_float = values.dtype.kind not in "iu"  # float16/32/64 and bfloat16
    count = len(labels)
    texts = np.empty(order.shape, dtype=object)
    for row in range(order.shape[0]):
        for j in range(k):
            index = int(order[row, j])
            value = values[row, j]
            text = f"{float(value):f}:{index}" if as_float else f"{int(value)}:{index}"
            label = labels[index] if index < count else ""
            texts[row, j] = (f"{text}:{label}" if label else text).encode("utf-8")
    if not batched:
        texts = texts.reshape(k)
    return Tensor(tensor.name, "BYTES", tuple(texts.shape), texts)


def read_labels(config: mc.ModelConfig, model_dir: Path) -> dict[str, tuple[str, ...]]:
    """Each output's labels from its `label_filename` (one label per line), read when the
    model loads. Raises ConfigError naming the field when the file is missing, unreadable,
    or outside the model directory (a config must not read files elsewhere: the check is
    repository.paths', which the load has already applied; applied again here, where the
    file is read)."""
    labels: dict[str, tuple[str, ...]] = {}
    for out in config.output:
        if not out.label_filename:
            continue
        field = f"{config.name}/config.pbtxt: output '{out.name}': label_filename"
        path = confined(model_dir, out.label_filename, "", field)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(
                f"{field}: {config.name}/{out.label_filename} does not exist"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(
                f"{field}: cannot read {config.name}/{out.label_filename}: {reason}"
            ) from None
        labels[out.name] = tuple(text.splitlines())
    return labels
