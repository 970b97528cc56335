"""The API a Python model implements: `model.py` defines a class named `Model`.

    class Model(inferd.PythonModel):
        def load(self, context):            # once per instance, before the first request
            ...
        def predict(self, inputs):          # a batch: {input name: array}, batch dim first
            return {"OUT": inputs["IN"] * 2}  # {output name: array}, same batch size
        # or predict(self, inputs, requests): `requests` tells, per request of the batch in
        # row order, its correlation_id() and sequence flags() (sequence models)
        def unload(self):                   # once, when the version is unloaded
            ...

See docs/python-models.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inferd.types import Array


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a Python model learns about itself at load time."""

    name: str
    version: str
    version_dir: Path  # the folder holding model.py: load weights relative to it
    max_batch_size: int
    parameters: dict[str, str]  # the config's `parameters` as plain strings
    instance_index: int
    config: Any  # the full Triton ModelConfig message, for anything else


# Bits of `RequestInfo.flags()`: Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END.
SEQUENCE_START = 1
SEQUENCE_END = 2


class _SequenceFields(Protocol):
    request_id: str
    rows: int
    correlation_id: int | str
    flags: int


class RequestInfo:
    """Who sent one request of the batch `predict(inputs, requests)` receives.

    Requests are in row order: request i holds the next `rows` rows of every input. The
    method names are Triton's (`pb_utils.InferenceRequest`).
    """

    __slots__ = ("_correlation_id", "_flags", "request_id", "rows")

    def __init__(
        self, request_id: str = "", rows: int = 1, correlation_id: int | str = 0, flags: int = 0
    ) -> None:
        self.request_id = request_id
        self.rows = rows
        self._correlation_id = correlation_id
        self._flags = flags

    @classmethod
    def of(cls, request: _SequenceFields) -> RequestInfo:
        return cls(request.request_id, request.rows, request.correlation_id, request.flags)

    def correlation_id(self) -> int | str:
        """The request's sequence id (an int or a str); 0 when it is not part of a sequence."""
        return self._correlation_id

    def flags(self) -> int:
        """SEQUENCE_START (1) and/or SEQUENCE_END (2) when the request starts / ends its
        sequence; 0 otherwise."""
        return self._flags

    def __getstate__(self) -> tuple[str, int, int | str, int]:  # crosses to worker processes
        return (self.request_id, self.rows, self._correlation_id, self._flags)

    def __setstate__(self, state: tuple[str, int, int | str, int]) -> None:
        self.request_id, self.rows, self._correlation_id, self._flags = state

    def __repr__(self) -> str:
        return (
            f"RequestInfo(request_id={self.request_id!r}, rows={self.rows}, "
            f"correlation_id={self._correlation_id!r}, flags={self._flags})"
        )


class PythonModel:
    """Base class for Python models; subclassing it is optional, the method names are not."""

    def load(self, context: ModelContext) -> None:
        """Prepare the model; raising here marks the version UNAVAILABLE with the message."""

    def predict(self, inputs: dict[str, Array]) -> dict[str, Array]:
        """Compute every output for one batch; each output keeps the inputs' batch size.

        A model may declare `predict(self, inputs, requests)` instead, to receive a
        `RequestInfo` per request of the batch.
        """
        raise NotImplementedError

    def unload(self) -> None:
        """Release what `load` acquired."""
