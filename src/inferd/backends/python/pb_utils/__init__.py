"""inferd's `triton_python_backend_utils`: Triton's Python-backend API for model code.

A `model.py` written for Triton does `import triton_python_backend_utils as pb_utils`; the
Python backend registers this package under that name before importing the model. Names and
behaviour follow Triton's python_backend. What inferd does not offer (request rescheduling)
raises `TritonModelException` naming the API; the list of every name and its status is
docs/python-models.md, walked by tests/integration/backends/test_pb_utils_api.py. Decoupled models
send their responses through `request.get_response_sender()` (an
`InferenceResponseSender`); a model calls another one with `InferenceRequest(...).exec()` or
`await .async_exec()` (BLS: inferd.dataplane.bls_runner).
"""

from __future__ import annotations

from inferd.backends.python.pb_utils.host import (
    MetricKind,
    get_model_dir,
    is_model_ready,
    load_model,
    unload_model,
)
from inferd.backends.python.pb_utils.logger import Logger, LogLevel
from inferd.backends.python.pb_utils.messages import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponseSender,
    InferenceTrace,
    PreferredMemory,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from inferd.backends.python.pb_utils.metric_family import Metric, MetricFamily
from inferd.backends.python.pb_utils.model_config import ModelConfig
from inferd.backends.python.pb_utils.responses import InferenceResponse, get_output_tensor_by_name
from inferd.backends.python.pb_utils.tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from inferd.backends.python.pb_utils.triton_errors import TritonError, TritonModelException

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
