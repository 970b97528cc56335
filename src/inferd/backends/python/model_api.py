"""The API a Python model implements: `model.py` defines a class named `Model`.

    class Model(inferd.PythonModel):
        def load(self, context):            # once per instance, before the first request
            ...
        def predict(self, inputs):          # a batch: {input name: array}, batch dim first
            return {"OUT": inputs["IN"] * 2}  # {output name: array}, same batch size
        # or predict(self, inputs, requests): `requests` tells, per request of the batch in
        # row order, its request_id, rows, parameters, correlation_id() and sequence flags()
        def unload(self):                   # once, when the version is unloaded
            ...

A decoupled model (`model_transaction_policy { decoupled: true }`) defines `predict_stream`
instead of `predict`: called once per request, it sends any number of responses and then the
final flag through a `ResponseSender`. `load`, `predict` and `unload` may be `async def`.
A model calls other models of the repository through the `ModelContext` given to `load`
(`context.infer`, `await context.infer_async`, `context.infer_stream`; BLS).

See docs/python-models.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from inferd.backends.python.bls_request import BlsCall, BlsResult
from inferd.errors import ErrorKind, InferdError
from inferd.streams import ResponseSink
from inferd.types import Array, RequestFields


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

    # Calls to other models (BLS), from `predict` / `predict_stream` while they run: made
    # for the requests being executed (their deadline and trace carry over; a client that
    # leaves cancels the calls not yet run), through the called model's own scheduler.

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: list[str] | None = None,
        *,
        version: str = "",
        timeout_us: int = 0,
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, Array]:
        """`model`'s outputs for `inputs` (every output, or those named in `outputs`),
        waiting for them. Raises `ModelCallError` (its `status`: NOT_FOUND, INVALID_ARGUMENT,
        DEADLINE_EXCEEDED, ...) when the call fails; `timeout_us` tightens the deadline."""
        call = _call(model, inputs, outputs, version, timeout_us, parameters, False)
        return _outputs(_submit("infer", call).result())

    async def infer_async(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: list[str] | None = None,
        *,
        version: str = "",
        timeout_us: int = 0,
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, Array]:
        """`infer` for an `async def predict`: several can be gathered."""
        call = _call(model, inputs, outputs, version, timeout_us, parameters, False)
        return _outputs(await asyncio.wrap_future(_submit("infer_async", call)))

    def infer_stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: list[str] | None = None,
        *,
        version: str = "",
        timeout_us: int = 0,
        parameters: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Array]]:
        """A decoupled model's responses, each as it comes (a model that is not decoupled
        gives one); an error response raises `ModelCallError` where it comes."""
        call = _call(model, inputs, outputs, version, timeout_us, parameters, True)
        results = _host("infer_stream").infer_stream(call)
        try:
            for result in results:
                if result.error_kind or result.outputs is not None:
                    yield _outputs(result)
        finally:  # the model stopped early: the call ends
            close = getattr(results, "close", None)
            if close is not None:
                close()


class ModelCallError(Exception):
    """A call to another model failed: `status` is the kind of failure, as its client would
    see it (`NOT_FOUND`, `INVALID_ARGUMENT`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
    `CANCELLED`, `MODEL_ERROR`, ...), `message` the reason."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _host(method: str) -> Any:
    """The server's side of the calls; imported here: `import inferd` stays light (the
    command line loads no backend)."""
    from inferd.backends.python.pb_utils.host import current_host
    from inferd.backends.python.pb_utils.triton_errors import TritonModelException

    try:
        return current_host(f"ModelContext.{method}")
    except TritonModelException as exc:
        raise ModelCallError("UNAVAILABLE", exc.message()) from None


def _submit(method: str, call: BlsCall) -> concurrent.futures.Future[BlsResult]:
    from inferd.backends.python.pb_utils.triton_errors import TritonModelException

    try:
        return _host(method).infer(call)  # type: ignore[no-any-return]
    except TritonModelException as exc:  # called from the server's loop, or it stopped
        raise ModelCallError("UNAVAILABLE", exc.message()) from None


def _call(
    model: str,
    inputs: Mapping[str, Any],
    outputs: list[str] | None,
    version: str,
    timeout_us: int,
    parameters: Mapping[str, Any] | None,
    decoupled: bool,
) -> BlsCall:
    if not isinstance(inputs, Mapping):
        raise TypeError(
            f"inputs must be a dict of input name to array, got {type(inputs).__name__}"
        )
    arrays = {name: np.asarray(value) for name, value in inputs.items()}
    names = None if outputs is None else list(outputs)
    return BlsCall(
        model, str(version), arrays, names, "", dict(parameters or {}), int(timeout_us), decoupled
    )


def _outputs(result: BlsResult) -> dict[str, Array]:
    if result.error_kind:
        raise ModelCallError(result.error_kind, result.error)
    return dict(result.outputs or {})


_NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})


class RequestInfo:
    """Who sent one request of the batch `predict(inputs, requests)` receives.

    Requests are in row order: request i holds the next `rows` rows of every input.
    `parameters` are the request's parameters (Triton's reserved keys, such as `priority` and
    `timeout`, left out; docs/python-models.md). The method names are Triton's
    (`pb_utils.InferenceRequest`).
    """

    __slots__ = ("_correlation_id", "_flags", "parameters", "request_id", "rows")

    def __init__(
        self,
        request_id: str = "",
        rows: int = 1,
        correlation_id: int | str = 0,
        flags: int = 0,
        parameters: Mapping[str, Any] = _NO_PARAMETERS,
    ) -> None:
        self.request_id = request_id
        self.rows = rows
        self.parameters = parameters
        self._correlation_id = correlation_id
        self._flags = flags

    @classmethod
    def of(cls, request: RequestFields) -> RequestInfo:
        return cls(
            request.request_id,
            request.rows,
            request.correlation_id,
            request.flags,
            request.parameters,
        )

    def correlation_id(self) -> int | str:
        """The request's sequence id (an int or a str); 0 when it is not part of a sequence."""
        return self._correlation_id

    def flags(self) -> int:
        """SEQUENCE_START (1) and/or SEQUENCE_END (2) when the request starts / ends its
        sequence; 0 otherwise."""
        return self._flags

    def __getstate__(self) -> tuple[str, int, int | str, int, dict[str, Any]]:
        # Crosses to worker processes (a mapping proxy does not pickle: a dict does).
        return (
            self.request_id,
            self.rows,
            self._correlation_id,
            self._flags,
            dict(self.parameters),
        )

    def __setstate__(self, state: tuple[str, int, int | str, int, dict[str, Any]]) -> None:
        self.request_id, self.rows, self._correlation_id, self._flags, self.parameters = state

    def __repr__(self) -> str:
        return (
            f"RequestInfo(request_id={self.request_id!r}, rows={self.rows}, "
            f"correlation_id={self._correlation_id!r}, flags={self._flags}, "
            f"parameters={dict(self.parameters)!r})"
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

    def predict_stream(self, inputs: dict[str, Array], responses: ResponseSender) -> None:
        """A decoupled model's answer to one request: `responses.send(...)` any number of
        times, then `responses.close()` (or `send(..., final=True)`), here or later from a
        thread of the model's. Raising fails this request alone."""
        raise NotImplementedError

    def unload(self) -> None:
        """Release what `load` acquired."""


class ResponseSender:
    """The responses of one request to a decoupled model.

    `send` may block while the client reads slower than the model sends (a bounded queue per
    request, docs/python-models.md). Once the client has gone, `is_cancelled()` is True and
    sends are dropped: stop working and `close()`. Sending after the final flag raises
    `inferd.streams.StreamClosedError`.
    """

    def __init__(
        self, sink: ResponseSink, model: str, request_id: str, parameters: Mapping[str, Any]
    ) -> None:
        self._sink = sink
        self._model = model
        self.request_id = request_id  # the client's request id, "" when it sent none
        self.parameters = parameters  # the request's parameters (e.g. generate's keys)

    def send(self, outputs: Mapping[str, Any], final: bool = False) -> None:
        """One response: {output name: array}; `final=True` makes it the last one."""
        if not isinstance(outputs, Mapping):
            raise TypeError(
                f"send() takes a dict of output name to array, got {type(outputs).__name__}"
            )
        arrays = {name: np.asarray(value) for name, value in outputs.items()}
        self._sink.send(arrays, None, final)

    def send_error(self, message: str, final: bool = False) -> None:
        """An error response to this request (HTTP 500 / gRPC INTERNAL with `message`)."""
        error = InferdError(ErrorKind.MODEL_ERROR, f"model '{self._model}': {message}")
        self._sink.send(None, error, final)

    def close(self) -> None:
        """The final flag, with no response: nothing more comes for this request."""
        self._sink.send(None, None, True)

    def is_cancelled(self) -> bool:
        """True once the client has gone away."""
        return self._sink.is_cancelled()
