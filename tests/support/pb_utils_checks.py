"""Every name Triton's python_backend documents for `triton_python_backend_utils`, each with
a check that exercises it (status "works") or asserts that it raises naming itself
("refused"). A model's `execute` runs them inside a real server (tests/integration/
test_pb_utils_api.py), in the server process and in a worker process.

TRITON_NAMES is Triton's list, written down from its python_backend README (Usage, Request
Parameters, Error Handling, BLS, Model Loading API, Interoperability, Custom Metrics,
Logging) and `src/resources/triton_python_backend_utils.py`; CHECKS must cover it exactly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

TRITON_NAMES = (
    # module-level helpers and tables (triton_python_backend_utils.py)
    "TRITON_STRING_TO_NUMPY",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    # auto-complete
    "ModelConfig.as_dict",
    "ModelConfig.set_max_batch_size",
    "ModelConfig.set_dynamic_batching",
    "ModelConfig.add_input",
    "ModelConfig.add_output",
    "ModelConfig.set_model_transaction_policy",
    # errors
    "TritonError",
    "TritonError.message",
    "TritonError.code",
    "TritonError.UNKNOWN",
    "TritonError.INTERNAL",
    "TritonError.NOT_FOUND",
    "TritonError.INVALID_ARG",
    "TritonError.UNAVAILABLE",
    "TritonError.UNSUPPORTED",
    "TritonError.ALREADY_EXISTS",
    "TritonError.CANCELLED",
    "TritonModelException",
    "TritonModelException.message",
    # tensors and DLPack
    "Tensor",
    "Tensor.name",
    "Tensor.as_numpy",
    "Tensor.triton_dtype",
    "Tensor.shape",
    "Tensor.is_cpu",
    "Tensor.to_dlpack",
    "Tensor.from_dlpack",
    "Tensor.__dlpack__",
    "Tensor.__dlpack_device__",
    # requests and responses
    "InferenceRequest",
    "InferenceRequest.inputs",
    "InferenceRequest.request_id",
    "InferenceRequest.correlation_id",
    "InferenceRequest.flags",
    "InferenceRequest.set_flags",
    "InferenceRequest.timeout",
    "InferenceRequest.parameters",
    "InferenceRequest.trace",
    "InferenceTrace.get_context",
    "InferenceRequest.requested_output_names",
    "InferenceRequest.is_cancelled",
    "InferenceRequest.get_response_sender",
    "InferenceResponseSender.send",
    "InferenceResponseSender.is_cancelled",
    "InferenceRequest.set_release_flags",
    "InferenceRequest.exec",
    "InferenceRequest.async_exec",
    "PreferredMemory",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_MEMORY_CPU",
    "InferenceResponse",
    "InferenceResponse.output_tensors",
    "InferenceResponse.has_error",
    "InferenceResponse.error",
    "InferenceResponse.parameters",
    # logging
    "Logger.log",
    "Logger.log_info",
    "Logger.log_warn",
    "Logger.log_error",
    "Logger.log_verbose",
    "Logger.INFO",
    "Logger.WARNING",
    "Logger.ERROR",
    "Logger.VERBOSE",
    # custom metrics
    "MetricFamily",
    "MetricFamily.COUNTER",
    "MetricFamily.GAUGE",
    "MetricFamily.HISTOGRAM",
    "MetricFamily.Metric",
    "Metric.increment",
    "Metric.set",
    "Metric.observe",
    "Metric.value",
    # model management and the model's folder
    "load_model",
    "unload_model",
    "unload_model(unload_dependents=True)",
    "is_model_ready",
    "get_model_dir",
)


@dataclass
class Context:
    """What the checks get: pb_utils, the request being executed, and where they run."""

    pb: Any
    request: Any
    other_model: str  # a model of the same repository the checks load and unload
    label: str  # tells this run's metric series apart
    model_dir: str
    decoupled: bool = False  # the walking model answers through response senders


def _eq(got: Any, want: Any) -> None:
    assert got == want, f"{got!r} != {want!r}"


def _tensor(c: Context) -> Any:
    return c.pb.Tensor("T", np.arange(6, dtype=np.int32).reshape(2, 3))


def _bytes_round_trip(c: Context) -> None:
    data = np.array([b"a", b"", "\u00e9"], dtype=object)
    wire = c.pb.serialize_byte_tensor(data)
    _eq(wire, b"\x01\x00\x00\x00a\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9")
    _eq(list(c.pb.deserialize_bytes_tensor(wire)), [b"a", b"", "\u00e9".encode()])


def _config_lookups(c: Context) -> None:
    config = {"input": [{"name": "IN"}], "output": [{"name": "OUT"}]}
    _eq(c.pb.get_input_config_by_name(config, "IN"), {"name": "IN"})
    _eq(c.pb.get_output_config_by_name(config, "IN"), None)


def _auto_complete(c: Context, method: str) -> None:
    config = c.pb.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0}))
    if method == "as_dict":
        _eq(config.as_dict()["input"], [])
    elif method == "set_max_batch_size":
        config.set_max_batch_size(4)
        _eq(config.as_dict()["max_batch_size"], 4)
    elif method == "set_dynamic_batching":
        config.set_dynamic_batching()
        _eq(config.as_dict()["dynamic_batching"], {})
    elif method in ("add_input", "add_output"):
        getattr(config, method)({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
        _eq(config.as_dict()[method[4:]][0]["dims"], [2])
    else:
        config.set_model_transaction_policy({"decoupled": False})
        _eq(config.as_dict()["model_transaction_policy"], {"decoupled": False})


def _dlpack(c: Context, how: str) -> None:
    tensor = _tensor(c)
    if how == "to":
        back = np.from_dlpack(tensor)  # through __dlpack__
        np.testing.assert_array_equal(back, tensor.as_numpy())
        assert c.pb.Tensor.from_dlpack("B", tensor.to_dlpack()).shape() == [2, 3]
    elif how == "from":
        made = c.pb.Tensor.from_dlpack("B", np.ones(3, np.float32))
        np.testing.assert_array_equal(made.as_numpy(), np.ones(3, np.float32))
    else:
        _eq(tensor.__dlpack_device__(), (1, 0))


def _parameters(c: Context) -> None:
    sent = json.loads(c.request.parameters())
    _eq(sent["walk"], "yes")
    assert "priority" not in sent and "timeout" not in sent, sent


def _error(c: Context) -> None:
    error = c.pb.TritonError("gone", c.pb.TritonError.NOT_FOUND)
    _eq((error.message(), error.code()), ("gone", 2))
    _eq(c.pb.TritonError("x").code(), c.pb.TritonError.INTERNAL)


def _exception(c: Context) -> None:
    _eq(c.pb.TritonModelException("boom").message(), "boom")


def _response(c: Context, what: str) -> None:
    out = c.pb.Tensor("OUT", np.zeros(1, np.float32))
    response = c.pb.InferenceResponse(output_tensors=[out], parameters={"k": 1})
    failed = c.pb.InferenceResponse(error=c.pb.TritonError("no"))
    if what == "init":
        assert c.pb.get_output_tensor_by_name(response, "OUT") is out
    elif what == "output_tensors":
        _eq(response.output_tensors(), [out])
    elif what == "has_error":
        _eq((response.has_error(), failed.has_error()), (False, True))
    elif what == "error":
        _eq(failed.error().message(), "no")
    else:
        _eq(json.loads(response.parameters()), {"k": 1})


def _built_request(c: Context) -> Any:
    return c.pb.InferenceRequest(
        model_name=c.other_model,
        inputs=[_tensor(c)],
        requested_output_names=["OUT"],
        request_id="bls-1",
        correlation_id=7,
        preferred_memory=c.pb.PreferredMemory(c.pb.TRITONSERVER_MEMORY_CPU, 0),
        parameters={"p": True},
    )


def _set_flags(c: Context) -> None:
    request = _built_request(c)
    request.set_flags(c.pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
    _eq((request.flags(), request.correlation_id()), (1, 7))


def _bls_request(c: Context) -> Any:
    """A BLS call to the other model (IN -> OUT, as given)."""
    tensor = c.pb.Tensor("IN", np.array([2.5], np.float32))
    return c.pb.InferenceRequest(
        model_name=c.other_model, inputs=[tensor], requested_output_names=["OUT"]
    )


def _bls_answered(c: Context, response: Any) -> None:
    assert not response.has_error(), response.error().message()
    out = c.pb.get_output_tensor_by_name(response, "OUT")
    _eq(out.as_numpy().tolist(), [2.5])


def _exec(c: Context) -> None:
    _bls_answered(c, _bls_request(c).exec())
    # A failure is a response the model reads, not an exception (as in Triton).
    missing = c.pb.InferenceRequest(
        model_name="no_such_model", inputs=[], requested_output_names=["OUT"]
    ).exec()
    _eq((missing.has_error(), missing.error().code()), (True, c.pb.TritonError.NOT_FOUND))
    responses = list(_bls_request(c).exec(decoupled=True))  # not decoupled: one response
    _bls_answered(c, responses[0])
    _eq(len(responses), 1)


def _async_exec(c: Context) -> None:
    async def call() -> None:
        _bls_answered(c, await _bls_request(c).async_exec())

    asyncio.run(call())


def _logger(c: Context, name: str) -> None:
    if name == "log":
        c.pb.Logger.log("walk: log", c.pb.Logger.WARNING)
    else:
        getattr(c.pb.Logger, name)(f"walk: {name}")


def _family(c: Context, kind: str) -> Any:
    return c.pb.MetricFamily(
        name=f"walk_{kind.lower()}",
        description=f"a {kind} of the API walk",
        kind=getattr(c.pb.MetricFamily, kind),
    )


def _metric(c: Context, kind: str, op: str) -> None:
    buckets = [1.0, 10.0] if kind == "HISTOGRAM" else None
    metric = _family(c, kind).Metric(labels={"run": c.label}, buckets=buckets)
    if op == "increment":
        before = metric.value()
        metric.increment(2.5)
        _eq(metric.value(), before + 2.5)
    elif op == "set":
        metric.set(42.0)
        _eq(metric.value(), 42.0)
    else:
        metric.observe(5.0)


def _models(c: Context, what: str) -> None:
    if what == "load":
        c.pb.load_model(model_name=c.other_model)
        assert c.pb.is_model_ready(c.other_model)
    elif what == "unload":
        c.pb.unload_model(c.other_model)
        assert not c.pb.is_model_ready(model_name=c.other_model, model_version="1")
        c.pb.load_model(c.other_model)  # as it was
    elif what == "ready":
        assert c.pb.is_model_ready(c.other_model, "1")
    else:
        c.pb.unload_model(c.other_model, unload_dependents=True)


def _sender(c: Context, what: str) -> None:
    sender = c.request.get_response_sender()
    if what == "is_cancelled":
        _eq(sender.is_cancelled(), False)
        return
    partial = c.pb.InferenceResponse([c.pb.Tensor("OUT", np.ones(1, np.float32))])
    sender.send(partial)  # a response before the walk's own report, which closes the stream
    with _Raises(c, "Unsupported flag"):
        sender.send(flags=4)


class _Raises:
    """Assert that the block raises TritonModelException with `words` in its message."""

    def __init__(self, c: Context, words: str) -> None:
        self._exception = c.pb.TritonModelException
        self._words = words

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        assert isinstance(exc, self._exception), f"did not raise {self._words!r}"
        assert self._words in str(exc), str(exc)
        return True


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "works" or "refused"; "works-if-decoupled": works there, refused elsewhere
    run: Callable[[Context], Any]
    decoupled_only: bool = False  # needs a decoupled model's sender: skipped elsewhere

    def expected(self, context: Context) -> str:
        if self.status == "works-if-decoupled":
            return "works" if context.decoupled else "refused"
        if self.decoupled_only and not context.decoupled:
            return "skipped"
        return self.status


def _works(name: str, run: Callable[[Context], Any]) -> Check:
    return Check(name, "works", run)


def _refused(name: str, run: Callable[[Context], Any]) -> Check:
    return Check(name, "refused", run)


CHECKS = [
    _works(
        "TRITON_STRING_TO_NUMPY",
        lambda c: _eq(c.pb.TRITON_STRING_TO_NUMPY["TYPE_FP16"], np.float16),
    ),
    _works("serialize_byte_tensor", _bytes_round_trip),
    _works("deserialize_bytes_tensor", _bytes_round_trip),
    _works(
        "get_input_tensor_by_name",
        lambda c: _eq(c.pb.get_input_tensor_by_name(c.request, "IN").name(), "IN"),
    ),
    _works("get_output_tensor_by_name", lambda c: _response(c, "init")),
    _works("get_input_config_by_name", _config_lookups),
    _works("get_output_config_by_name", _config_lookups),
    _works(
        "using_decoupled_model_transaction_policy",
        lambda c: _eq(
            c.pb.using_decoupled_model_transaction_policy(
                {"model_transaction_policy": {"decoupled": True}}
            ),
            True,
        ),
    ),
    _works("triton_to_numpy_type", lambda c: _eq(c.pb.triton_to_numpy_type(13), np.object_)),
    _works("numpy_to_triton_type", lambda c: _eq(c.pb.numpy_to_triton_type(np.uint16), 3)),
    _works(
        "triton_string_to_numpy", lambda c: _eq(c.pb.triton_string_to_numpy("TYPE_BOOL"), np.bool_)
    ),
    _works(
        "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
        lambda c: _eq(c.pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, 1),
    ),
    _works(
        "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
        lambda c: _eq(c.pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END, 2),
    ),
    _works(
        "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
        lambda c: _eq(c.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL, 1),
    ),
    _works(
        "TRITONSERVER_REQUEST_RELEASE_ALL", lambda c: _eq(c.pb.TRITONSERVER_REQUEST_RELEASE_ALL, 1)
    ),
    _works(
        "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
        lambda c: _eq(c.pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, 2),
    ),
    *[
        _works(f"ModelConfig.{m}", lambda c, m=m: _auto_complete(c, m))  # type: ignore[misc]
        for m in (
            "as_dict",
            "set_max_batch_size",
            "set_dynamic_batching",
            "add_input",
            "add_output",
            "set_model_transaction_policy",
        )
    ],
    _works("TritonError", _error),
    _works("TritonError.message", _error),
    _works("TritonError.code", _error),
    *[
        _works(
            f"TritonError.{code}",
            lambda c, code=code, n=n: _eq(getattr(c.pb.TritonError, code), n),  # type: ignore[misc]
        )
        for n, code in enumerate(
            (
                "UNKNOWN",
                "INTERNAL",
                "NOT_FOUND",
                "INVALID_ARG",
                "UNAVAILABLE",
                "UNSUPPORTED",
                "ALREADY_EXISTS",
                "CANCELLED",
            )
        )
    ],
    _works("TritonModelException", _exception),
    _works("TritonModelException.message", _exception),
    _works("Tensor", lambda c: _eq(_tensor(c).as_numpy().dtype, np.int32)),
    _works("Tensor.name", lambda c: _eq(_tensor(c).name(), "T")),
    _works("Tensor.as_numpy", lambda c: _eq(int(_tensor(c).as_numpy().sum()), 15)),
    _works("Tensor.triton_dtype", lambda c: _eq(_tensor(c).triton_dtype(), 8)),
    _works("Tensor.shape", lambda c: _eq(_tensor(c).shape(), [2, 3])),
    _works("Tensor.is_cpu", lambda c: _eq(_tensor(c).is_cpu(), True)),
    _works("Tensor.to_dlpack", lambda c: _dlpack(c, "to")),
    _works("Tensor.from_dlpack", lambda c: _dlpack(c, "from")),
    _works("Tensor.__dlpack__", lambda c: _dlpack(c, "to")),
    _works("Tensor.__dlpack_device__", lambda c: _dlpack(c, "device")),
    _works("InferenceRequest", lambda c: _eq(_built_request(c).request_id(), "bls-1")),
    _works(
        "InferenceRequest.inputs", lambda c: _eq([t.name() for t in c.request.inputs()], ["IN"])
    ),
    _works("InferenceRequest.request_id", lambda c: _eq(c.request.request_id(), "walk-request")),
    _works("InferenceRequest.correlation_id", lambda c: _eq(c.request.correlation_id(), 0)),
    _works("InferenceRequest.flags", lambda c: _eq(c.request.flags(), 0)),
    _works("InferenceRequest.set_flags", _set_flags),
    _works("InferenceRequest.timeout", lambda c: _eq(c.request.timeout(), 0)),
    _works("InferenceRequest.parameters", _parameters),
    _works(
        "InferenceRequest.trace", lambda c: _eq(type(c.request.trace()).__name__, "InferenceTrace")
    ),
    _works("InferenceTrace.get_context", lambda c: _eq(c.request.trace().get_context(), None)),
    _works(
        "InferenceRequest.requested_output_names",
        lambda c: _eq(c.request.requested_output_names(), ["OUT", "REPORT"]),
    ),
    _works("InferenceRequest.is_cancelled", lambda c: _eq(c.request.is_cancelled(), False)),
    Check(
        "InferenceRequest.get_response_sender",
        "works-if-decoupled",
        lambda c: c.request.get_response_sender(),
    ),
    Check("InferenceResponseSender.send", "works", lambda c: _sender(c, "send"), True),
    Check(
        "InferenceResponseSender.is_cancelled", "works", lambda c: _sender(c, "is_cancelled"), True
    ),
    _refused(
        "InferenceRequest.set_release_flags",
        lambda c: c.request.set_release_flags(c.pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE),
    ),
    _works("InferenceRequest.exec", _exec),
    _works("InferenceRequest.async_exec", _async_exec),
    _works("PreferredMemory", lambda c: _eq(_built_request(c).request_id(), "bls-1")),
    _works(
        "TRITONSERVER_MEMORY_GPU", lambda c: c.pb.PreferredMemory(c.pb.TRITONSERVER_MEMORY_GPU, 0)
    ),
    _works("TRITONSERVER_MEMORY_CPU", lambda c: c.pb.PreferredMemory(c.pb.TRITONSERVER_MEMORY_CPU)),
    _works("InferenceResponse", lambda c: _response(c, "init")),
    _works("InferenceResponse.output_tensors", lambda c: _response(c, "output_tensors")),
    _works("InferenceResponse.has_error", lambda c: _response(c, "has_error")),
    _works("InferenceResponse.error", lambda c: _response(c, "error")),
    _works("InferenceResponse.parameters", lambda c: _response(c, "parameters")),
    *[
        _works(f"Logger.{name}", lambda c, name=name: _logger(c, name))  # type: ignore[misc]
        for name in ("log", "log_info", "log_warn", "log_error", "log_verbose")
    ],
    *[
        _works(
            f"Logger.{level}",
            lambda c, level=level: c.pb.Logger.log(f"walk: {level}", getattr(c.pb.Logger, level)),  # type: ignore[misc]
        )
        for level in ("INFO", "WARNING", "ERROR", "VERBOSE")
    ],
    _works("MetricFamily", lambda c: _family(c, "GAUGE")),
    *[
        _works(f"MetricFamily.{kind}", lambda c, kind=kind: _family(c, kind))  # type: ignore[misc]
        for kind in ("COUNTER", "GAUGE", "HISTOGRAM")
    ],
    _works("MetricFamily.Metric", lambda c: _metric(c, "COUNTER", "increment")),
    _works("Metric.increment", lambda c: _metric(c, "COUNTER", "increment")),
    _works("Metric.set", lambda c: _metric(c, "GAUGE", "set")),
    _works("Metric.observe", lambda c: _metric(c, "HISTOGRAM", "observe")),
    _works("Metric.value", lambda c: _metric(c, "GAUGE", "set")),
    _works("load_model", lambda c: _models(c, "load")),
    _works("unload_model", lambda c: _models(c, "unload")),
    _refused("unload_model(unload_dependents=True)", lambda c: _models(c, "dependents")),
    _works("is_model_ready", lambda c: _models(c, "ready")),
    _works("get_model_dir", lambda c: _eq(c.pb.get_model_dir(), c.model_dir)),
]


def run_checks(context: Context) -> list[dict[str, str]]:
    """Each check's outcome: "works" (ran, its assertions held), "refused" (raised naming
    itself), or "failed: ..." with what went wrong."""
    report = []
    for check in CHECKS:
        expected = check.expected(context)
        if expected == "skipped":
            report.append({"name": check.name, "expected": expected, "outcome": "skipped"})
            continue
        try:
            check.run(context)
        except Exception as exc:
            message = str(exc)
            names_itself = check.name in message and isinstance(
                exc, context.pb.TritonModelException | NotImplementedError
            )
            outcome = "refused" if names_itself else f"failed: {type(exc).__name__}: {message}"
        else:
            outcome = "works"
        report.append({"name": check.name, "expected": expected, "outcome": outcome})
    return report
