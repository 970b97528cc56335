"""inferd's `triton_python_backend_utils`: the part of Triton's Python-backend API models use.

A `model.py` written for Triton does `import triton_python_backend_utils as pb_utils`; the
Python backend registers this module under that name before importing the model. Names and
behaviour follow Triton's python_backend; what inferd does not offer (BLS requests, GPU
tensors) raises `TritonModelException` saying so. Decoupled models send their responses through
`request.get_response_sender()` (an `InferenceResponseSender`).
"""

from __future__ import annotations

import enum
import importlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from inferd.errors import InferdError
from inferd.model_output import current_model
from inferd.streams import ResponseSink, StreamClosedError
from inferd.types import Array

# The flag of a decoupled model's last send for a request (TRITONSERVER_ResponseCompleteFlag).
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

# Config `data_type` strings, as in the model_config JSON that `initialize` receives.
TRITON_STRING_TO_NUMPY: dict[str, type[Any]] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType codes, which `Tensor.triton_dtype()` returns.
_TRITON_CODES: dict[int, type[Any]] = {
    code: TRITON_STRING_TO_NUMPY[name]
    for code, name in enumerate(
        (
            "TYPE_BOOL",
            "TYPE_UINT8",
            "TYPE_UINT16",
            "TYPE_UINT32",
            "TYPE_UINT64",
            "TYPE_INT8",
            "TYPE_INT16",
            "TYPE_INT32",
            "TYPE_INT64",
            "TYPE_FP16",
            "TYPE_FP32",
            "TYPE_FP64",
            "TYPE_STRING",
        ),
        start=1,
    )
}
_NUMPY_TO_CODE: dict[np.dtype[Any], int] = {np.dtype(t): c for c, t in _TRITON_CODES.items()}


def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """ "TYPE_FP32" -> np.float32, "TYPE_STRING" -> np.object_."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type[Any] | None:
    return _TRITON_CODES.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType code of a numpy dtype (bytes/str/object are BYTES)."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OS":
        return 13
    return _NUMPY_TO_CODE.get(dtype.newbyteorder("="))


# Bits of InferenceRequest.flags(): the request starts / ends its sequence (Triton's values).
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class TritonModelException(Exception):  # noqa: N818 (Triton's name)
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class TritonError:
    """An error answering one request; `code` picks the status the client gets."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._msg = message
        self._code = code

    def message(self) -> str:
        return self._msg

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._msg


def _torch_dlpack() -> ModuleType:
    try:
        return importlib.import_module("torch.utils.dlpack")
    except ImportError:
        raise TritonModelException(
            "DLPack conversion in inferd's pb_utils needs torch, which is not installed; "
            "use Tensor(name, numpy_array) and as_numpy() instead"
        ) from None


class Tensor:
    """A named input or output tensor, held as a numpy array in CPU memory."""

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        array: Array = np.asarray(numpy_array)
        if array.dtype.type is np.str_ or array.dtype.kind == "V":
            raise TritonModelException(
                f"Tensor '{name}': numpy dtype {array.dtype} is not supported by the Python "
                "backend; use np.object_ (elements bytes or str) instead"
            )
        if triton_dtype is not None:
            wanted = triton_to_numpy_type(triton_dtype)
            if wanted is None:
                raise TritonModelException(f"Tensor '{name}': unknown triton_dtype {triton_dtype}")
            if array.dtype != wanted:
                array = array.view(wanted)  # reinterpret the bytes, as Triton does
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Array:
        return self._array

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (through torch; BYTES tensors have none)."""
        dlpack = _torch_dlpack()
        if self._array.dtype.kind == "O":
            raise TritonModelException(f"Tensor '{self._name}': BYTES tensors have no DLPack form")
        array = self._array if self._array.flags.writeable else self._array.copy()
        torch = importlib.import_module("torch")
        return dlpack.to_dlpack(torch.from_numpy(np.ascontiguousarray(array)))

    @staticmethod
    def from_dlpack(name: str, dlpack_capsule: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with `__dlpack__` (e.g. a torch tensor).

        Data on a GPU is copied to host memory: inferd's Python backend works on CPU tensors.
        """
        tensor = _torch_dlpack().from_dlpack(dlpack_capsule)
        return Tensor(name, tensor.detach().cpu().numpy())


class InferenceRequest:
    """One client request as `execute` receives it.

    Building one inside a model to call another model (BLS, `exec`/`async_exec`) is not
    supported by inferd.
    """

    def __init__(
        self,
        inputs: Sequence[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        flags: int = 0,
        parameters: Mapping[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._inputs = list(inputs)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._requested_output_names = list(requested_output_names)
        self._model_name = model_name
        self._parameters = parameters or {}
        self._sender: InferenceResponseSender | None = None  # set for decoupled models

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

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as Triton hands them over."""
        if isinstance(self._parameters, str):
            return self._parameters
        return json.dumps(dict(self._parameters))  # only when the model asks: off the hot path

    def is_cancelled(self) -> bool:
        """True once the client went away (decoupled models; otherwise always False)."""
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for decoupled models: set model_transaction_policy "
                "{ decoupled: true } in config.pbtxt, or return one response per request from "
                "execute()"
            )
        return self._sender

    def exec(self, *_: Any, **__: Any) -> InferenceResponse:
        raise TritonModelException(
            "BLS (InferenceRequest.exec: calling another model from a model) is not "
            "supported by inferd"
        )

    async def async_exec(self, *_: Any, **__: Any) -> InferenceResponse:
        return self.exec()


class InferenceResponse:
    """The answer to one request: its output tensors, or an error failing it alone."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        **_: Any,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list | tuple):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


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


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
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


class LogLevel(enum.IntEnum):
    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


class Logger:
    """Triton's model logger: lines go to logger `inferd.model.<name>` of the running model."""

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        model = current_model()
        name = f"inferd.model.{model}" if model else "inferd.model"
        extra = {"model": model} if model else None
        logging.getLogger(name).log(int(level), message, extra=extra)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)
