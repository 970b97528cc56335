"""`InferenceResponse`: the answer to one request, as a model builds it or as a BLS call
(InferenceRequest.exec) gives it back; `ResponseIterator`: a decoupled BLS call's responses."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from inferd.backends.python.bls_request import BlsResult
from inferd.backends.python.pb_utils.tensor import Tensor
from inferd.backends.python.pb_utils.triton_errors import TritonError, TritonModelException


def parameters_json(parameters: Mapping[str, Any] | None, where: str) -> str:
    """Triton's rule for parameters a model sets: str keys, bool/int/str values; as JSON."""
    for key, value in (parameters or {}).items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"{where}: parameters keys must be str, found {type(key).__name__}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"{where}: parameter '{key}' must be a bool, int or str, found "
                f"{type(value).__name__}"
            )
    return json.dumps(dict(parameters or {}), separators=(",", ":"))


class InferenceResponse:
    """The answer to one request: its output tensors (and parameters), or an error failing
    it alone."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list | tuple):
            raise TritonModelException('"output_tensors" must be a list.')
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f'"error" must be a pb_utils.TritonError, got {type(error).__name__}'
            )
        self._output_tensors = list(output_tensors)
        self._error = error
        self._parameters_json = parameters_json(parameters, "InferenceResponse")
        self._parameters: dict[str, Any] = dict(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters_json

    def parameters_dict(self) -> dict[str, Any]:
        """inferd's: the parameters as given, for the response the client gets."""
        return self._parameters


# What a BLS failure's ErrorKind (its name) becomes in the response's TritonError.
_BLS_CODES = {
    "NOT_FOUND": TritonError.NOT_FOUND,
    "INVALID_ARGUMENT": TritonError.INVALID_ARG,
    "PAYLOAD_TOO_LARGE": TritonError.INVALID_ARG,
    "UNSUPPORTED": TritonError.UNSUPPORTED,
    "UNAVAILABLE": TritonError.UNAVAILABLE,
    "RESOURCE_EXHAUSTED": TritonError.UNAVAILABLE,
    "DEADLINE_EXCEEDED": TritonError.UNAVAILABLE,  # Triton's code for a timed-out request
    "ALREADY_EXISTS": TritonError.ALREADY_EXISTS,
    "CANCELLED": TritonError.CANCELLED,
}


def bls_response(result: BlsResult) -> InferenceResponse:
    """A BLS call's result as the model reads it."""
    if result.error_kind:
        code = _BLS_CODES.get(result.error_kind, TritonError.INTERNAL)
        return InferenceResponse(error=TritonError(result.error, code))
    tensors = [Tensor(name, array) for name, array in (result.outputs or {}).items()]
    return InferenceResponse(tensors, parameters=result.parameters)


class ResponseIterator:
    """The responses of a decoupled BLS call, as they come (Triton's ResponseIterator): the
    last one may hold no outputs (the final flag alone)."""

    def __init__(self, results: Iterator[BlsResult]) -> None:
        self._results = results

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return bls_response(next(self._results))

    def cancel(self) -> None:
        """Stop the call: responses not yet taken are dropped."""
        close = getattr(self._results, "close", None)
        if close is not None:
            close()


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None
