"""Ground-truth feedback: a label joined to the prediction captured under its request id.

Every captured request (dataplane/capture.py: sampled at the model's `capture_sample_rate`, with or
without `--capture-dir`) leaves its predicted classes here, by request id, for at most
`feedback_ttl_s` and among at most `max_pending` per model (the oldest are forgotten
first). `POST /v2/models/{m}/feedback {"id": ..., "label": ...}` joins a label to them: each
row right or wrong goes into the serving version's accuracy window. Everything runs on the
event loop: no lock; scrapes read the counts through snapshots.

A class output is: an integer output with one value per row (the class index), a float
output with several values per row (the class is the argmax), or a BYTES output with one
element per row (the class name). A label is a class index, or a class name where the
output has one (its `label_filename`, or a BYTES output); one per row: a list when the
request had several rows.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.errors import ErrorKind, InferdError, invalid, not_found
from inferd.events import Gone, forget_keys
from inferd.monitoring.accuracy import AccuracyWindow
from inferd.types import InferResponse, Tensor

if TYPE_CHECKING:
    from inferd.monitoring.capture_settings import CaptureOptions
    from inferd.tensors.signature import ModelSignature

MAX_PENDING = 50_000  # predictions per model waiting for a label


@dataclass(slots=True)
class Prediction:
    version: str
    classes: list[int] | list[str] | None  # one per row; None: no class output (`problem`)
    problem: str
    labels: tuple[str, ...]  # the output's label file: class name -> index
    expires: float  # time.monotonic()
    window: int  # its version's accuracy_window
    labelled: bool = False


class FeedbackIndex:
    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending  # per model
        self._pending: dict[str, OrderedDict[str, Prediction]] = {}
        self.windows: dict[tuple[str, str], AccuracyWindow] = {}
        self.counts: dict[tuple[str, str, str], int] = {}  # (model, version, outcome)

    def remember(
        self,
        model: str,
        version: str,
        options: CaptureOptions,
        signature: ModelSignature,
        request_id: str,
        response: InferResponse,
    ) -> None:
        """Keep a captured request's predicted classes until its label comes (or expires):
        the answer of `model` `version`, by its capture options and signature."""
        pending = self._pending.get(model)
        if pending is None:
            pending = self._pending[model] = OrderedDict()
        now = time.monotonic()
        while pending:  # forget the oldest: expired, or past the bound
            if len(pending) < self.max_pending and pending[next(iter(pending))].expires > now:
                break
            pending.popitem(last=False)
        name = options.accuracy_output
        output = next((t for t in response.outputs if t.name == name), None)
        classes: list[int] | list[str] | None = None
        if output is None:
            problem = f"the request did not ask for output '{name}', which feedback judges"
        elif output.shared_memory is not None:
            problem = f"the request placed output '{name}' in shared memory, out of reach"
        else:
            classes, problem = predicted_classes(output, signature.is_batched)
        labels = signature.labels.get(name, ())
        pending[request_id] = Prediction(
            version,
            classes,
            problem,
            labels,
            now + options.feedback_ttl_s,
            options.accuracy_window,
        )
        pending.move_to_end(request_id)

    def forget(self, gone: Gone) -> None:
        """Unloaded versions' accuracy and counts go, and their predictions still waiting
        for a label (a label for one then answers as for an id never captured)."""
        forget_keys(self.windows, gone)
        forget_keys(self.counts, gone)
        for model in list(self._pending):
            if gone(model, ""):
                del self._pending[model]
                continue
            pending = self._pending[model]
            stale = [rid for rid, p in pending.items() if gone(model, p.version)]
            for request_id in stale:
                del pending[request_id]

    def join(self, model: str, doc: dict[str, Any]) -> dict[str, Any]:
        """The answer to a feedback call on `model` (known to the registry)."""
        request_id = doc.get("id")
        if not isinstance(request_id, str) or not request_id:
            self._count(model, "", "invalid")
            raise invalid("feedback needs 'id': the request id its response carried")
        if "label" not in doc:
            self._count(model, "", "invalid")
            raise invalid("feedback needs 'label': the true class of the request's rows")
        pending = self._pending.get(model, OrderedDict())
        prediction = pending.get(request_id)
        if prediction is None:
            self._count(model, "", "unknown_id")
            raise not_found(
                f"no captured prediction of model '{model}' has id '{request_id}': it was not "
                f"sampled (capture_sample_rate), or is forgotten ({self.max_pending} newer "
                "ones, its version unloaded, or a server restart)"
            )
        version = prediction.version
        if prediction.expires <= time.monotonic():
            del pending[request_id]
            self._count(model, version, "expired")
            raise not_found(
                f"the prediction of model '{model}' with id '{request_id}' has expired "
                "(feedback_ttl_s)"
            )
        if prediction.labelled:
            self._count(model, version, "duplicate")
            raise InferdError(
                ErrorKind.ALREADY_EXISTS, f"request '{request_id}' already has its label"
            )
        if prediction.classes is None:
            self._count(model, version, "invalid")
            raise invalid(
                f"model '{model}' version {version} has no class output: {prediction.problem}"
            )
        try:
            truth = _labels(doc["label"], prediction)
        except InferdError:
            self._count(model, version, "invalid")
            raise
        outcomes = [p == t for p, t in zip(prediction.classes, truth, strict=True)]
        prediction.labelled = True
        window = self.windows.get((model, version))
        if window is None:
            window = self.windows[(model, version)] = AccuracyWindow(prediction.window)
        window.record(outcomes)
        self._count(model, version, "joined")
        return {
            "id": request_id,
            "model": model,
            "version": version,
            "correct": outcomes,
            "online_accuracy": window.value,
        }

    def _count(self, model: str, version: str, outcome: str) -> None:
        key = (model, version, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1


def predicted_classes(output: Tensor, batched: bool) -> tuple[list[int] | list[str] | None, str]:
    """The class of each row of a class output, or (None, why it is not one)."""
    data = output.data
    if data.size == 0:
        return None, f"output '{output.name}' has no values"
    rows = data.reshape(data.shape[0] if batched and data.ndim else 1, -1)
    width = rows.shape[1]
    kind = data.dtype.kind
    values = "1 value" if width == 1 else f"{width} values"
    what = f"output '{output.name}' ({output.datatype}, {values} per row)"
    if output.datatype == "BYTES" or kind in "OSU":
        if width != 1:
            return None, f"{what} is not a class name per row"
        return [_text(e) for e in rows[:, 0]], ""
    if kind in "iub" and output.datatype != "BF16":
        if width != 1:
            return None, f"{what} is not a class index per row"
        return [int(v) for v in rows[:, 0].tolist()], ""
    if kind == "f" and output.datatype != "BF16" and width > 1:
        return [int(v) for v in np.argmax(rows, axis=1).tolist()], ""
    return None, f"{what} is neither class indices, class scores nor class names"


def _labels(raw: object, prediction: Prediction) -> list[int] | list[str]:
    assert prediction.classes is not None
    rows = len(prediction.classes)
    values = raw if isinstance(raw, list) else [raw]
    if len(values) != rows:
        raise invalid(
            f"'label' must hold one label per row of the request: {rows}, got {len(values)}"
        )
    by_name = isinstance(prediction.classes[0], str) if rows else False
    truth: list[Any] = []
    for value in values:
        if by_name:
            if not isinstance(value, str):
                raise invalid(f"'label' {value!r} must be a class name (the output is BYTES)")
            truth.append(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            truth.append(value)
        elif isinstance(value, str) and value in prediction.labels:
            truth.append(prediction.labels.index(value))
        else:
            known = "a class index" + (" or a name of its label file" if prediction.labels else "")
            raise invalid(f"'label' {value!r} must be {known}")
    return truth


def _text(element: object) -> str:
    if isinstance(element, bytes | bytearray | memoryview):
        return bytes(element).decode("utf-8", "replace")
    return str(element)
