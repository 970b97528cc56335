"""`InferenceRequest` (a client's, or one a model builds to call another model: BLS), the
helpers and flags that go with it (`InferenceResponse` is in responses.py);
`InferenceResponseSender`: how a decoupled model answers a request (Triton's decoupled
mode). A decoupled model (`model_transaction_policy { decoupled: true }`) gets one sender
per request from `request.get_response_sender()` and sends zero or more responses, then the
final flag, from any thread; the responses go to the request's response stream
(inferd.streams)."""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inferd.backends.python.bls_request import BlsCall
from inferd.backends.python.pb_utils.host import current_host
from inferd.backends.python.pb_utils.responses import (
    InferenceResponse,
    ResponseIterator,
    bls_response,
    parameters_json,
)
from inferd.backends.python.pb_utils.tensor import Tensor
from inferd.backends.python.pb_utils.triton_errors import TritonModelException, not_supported
from inferd.errors import InferdError
from inferd.streams import ResponseSink, StreamClosedError
from inferd.types import Array

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Where a BLS request would like its outputs: the CPU (TRITONSERVER_MEMORY_CPU) is
    what inferd gives; asking for GPU memory fails the call naming the keyword."""

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace; inferd does not hand its trace context to Python models."""

    def get_context(self) -> str | None:
        return None


class InferenceRequest:
    """One client request as `execute` receives it, or one the model builds to call another
    model (BLS: `exec`, `async_exec`). A decoupled model answers it through
    `get_response_sender()`."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        model_version: int | str = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TritonModelException("InferenceRequest: flags must be an int")
        # Triton's is an int (-1: the default version); a version string is taken too.
        if isinstance(model_version, bool) or not isinstance(model_version, int | str):
            raise TritonModelException(
                "InferenceRequest: model_version must be an int (-1: the default version)"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise TritonModelException(
                "InferenceRequest: timeout must be a non-negative int (microseconds)"
            )
        if isinstance(requested_output_names, str) or not all(
            isinstance(n, str) for n in requested_output_names
        ):
            raise TritonModelException(
                "InferenceRequest: requested_output_names must be a list of str"
            )
        self._inputs = list(inputs)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._requested_output_names = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace or InferenceTrace()
        self._parameters_json: str | None = parameters_json(parameters, "InferenceRequest")
        self._parameters: Mapping[str, Any] = dict(parameters or {})
        self._is_cancelled: Callable[[], bool] | None = None
        self._sender: InferenceResponseSender | None = None  # set for decoupled models

    @classmethod
    def incoming(
        cls,
        inputs: list[Tensor],
        request_id: str,
        requested_output_names: list[str],
        parameters: Mapping[str, Any],
        timeout_us: int = 0,
        is_cancelled: Callable[[], bool] | None = None,
        correlation_id: int | str = 0,
        flags: int = 0,
    ) -> InferenceRequest:
        """A request a client sent, as the server hands it to `execute` (no checks: the
        server checked it already; the parameters JSON is only made if asked for)."""
        request = cls.__new__(cls)
        request._inputs = inputs
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._requested_output_names = requested_output_names
        request._model_name = ""
        request._model_version = -1
        request._flags = flags
        request._timeout = timeout_us
        request._preferred_memory = None
        request._trace = InferenceTrace()
        request._parameters_json = None
        request._parameters = parameters
        request._is_cancelled = is_cancelled
        request._sender = None
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence id (sequence models): an int, or a str for string ids; 0 if none."""
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def flags(self) -> int:
        """TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and/or _END (sequence models), else 0."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        """The request's `timeout` parameter in microseconds; 0 when it sent none."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object string (Triton's reserved ones, such
        as `priority`, `timeout` and `sequence_id`, left out)."""
        if self._parameters_json is None:
            self._parameters_json = json.dumps(dict(self._parameters), separators=(",", ":"))
        return self._parameters_json

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        """True once the client gave up on the request (cancelled it, or its deadline or
        queue timeout passed; a decoupled model's client left its stream): its answer will
        not be delivered."""
        if self._sender is not None:
            return self._sender.is_cancelled()
        return self._is_cancelled is not None and self._is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "InferenceRequest.get_response_sender() is for decoupled models: set "
                "model_transaction_policy { decoupled: true } in config.pbtxt, or return one "
                "response per request from execute()"
            )
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        raise not_supported(
            "request rescheduling (InferenceRequest.set_release_flags)",
            "it needs sequence_batching { iterative_sequence: true }",
        )

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on `model_name` and wait for its response (from `execute`
        in the instance's thread). A failure (no such model, a bad input, the deadline
        passed) comes back as a response whose `has_error()` is True; `decoupled=True`
        returns an iterator of the model's responses instead, the last one possibly empty
        (the final flag alone)."""
        call = self._bls_call(decoupled)
        host = current_host("InferenceRequest.exec")
        if decoupled:
            return ResponseIterator(host.infer_stream(call))
        return bls_response(host.infer(call).result())

    async def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` for an `async def execute`: awaits the response on the instance's own
        loop, so several calls can be gathered."""
        call = self._bls_call(decoupled)
        host = current_host("InferenceRequest.async_exec")
        if decoupled:
            return ResponseIterator(host.infer_stream(call))
        return bls_response(await asyncio.wrap_future(host.infer(call)))

    def _bls_call(self, decoupled: bool) -> BlsCall:
        api = "InferenceRequest"
        if not self._model_name:
            raise TritonModelException(f"{api}: model_name must name the model to call")
        memory = self._preferred_memory
        if memory is not None and memory.preferred_memory_type != TRITONSERVER_MEMORY_CPU:
            raise TritonModelException(
                f"{api}(preferred_memory=...): inferd serves Python models on the CPU; only "
                "TRITONSERVER_MEMORY_CPU outputs can be given"
            )
        parameters: dict[str, Any] = dict(self._parameters)
        if self._correlation_id:
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        inputs: dict[str, Array] = {}
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"{api}: inputs must be pb_utils.Tensor objects, found {type(tensor).__name__}"
                )
            inputs[tensor.name()] = tensor.as_numpy()
        version = "" if self._model_version in (-1, "", None) else str(self._model_version)
        return BlsCall(
            self._model_name,
            version,
            inputs,
            list(self._requested_output_names) or None,
            self._request_id,
            parameters,
            self._timeout,
            decoupled,
        )


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model, from any thread: zero or more
    `send(response)`, then `send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` (or the flag
    with the last response). A send may block while the client reads slower than the model
    sends; after the client left, sends are dropped and `is_cancelled()` is True."""

    def __init__(
        self, sink: ResponseSink, convert: Callable[[InferenceResponse], dict[str, Array]]
    ) -> None:
        self._sink = sink
        self._convert = convert  # a response's outputs, or raises InferdError

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}"
            )
        if response is not None and response.parameters_dict():
            raise TritonModelException(
                "InferenceResponse(parameters=...) is not supported for decoupled models yet: "
                "a streamed response carries outputs (or an error) only"
            )
        outputs: dict[str, Array] | None = None
        error: InferdError | None = None
        if response is not None:
            try:
                outputs = self._convert(response)
            except InferdError as exc:  # an error response, or one its config contradicts
                error = exc
        try:
            self._sink.send(outputs, error, flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except StreamClosedError:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed."
            ) from None

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled()


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config: Mapping[str, Any], field: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(field, []):
        if entry.get("name") == name:
            return dict(entry)
    return None


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The `input` entry of the model_config dict named `name`, or None."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The `output` entry of the model_config dict named `name`, or None."""
    return _config_entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the config asks for decoupled mode (which fails the load in inferd)."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))
