"""BLS requests as a model builds them, and what the server makes of them: the keywords
Triton accepts (and the one inferd cannot honour), the call a request becomes, the context
a call inherits from the batch it is made for, and the responses a result becomes.
(tests/integration/backends/test_bls.py runs real calls inside a server.)"""

from __future__ import annotations

import time

import numpy as np
import pytest

from inferd.backends.python import pb_utils
from inferd.backends.python.bls_request import BlsResult, Caller
from inferd.backends.python.pb_utils.responses import ResponseIterator, bls_response
from inferd.dataplane.bls_runner import parent_context
from inferd.events import CallContext


def _request(**kwargs: object) -> pb_utils.InferenceRequest:
    args: dict[str, object] = {
        "model_name": "other",
        "requested_output_names": ["OUT"],
        "inputs": [pb_utils.Tensor("IN", np.ones(2, np.float32))],
    }
    args.update(kwargs)
    return pb_utils.InferenceRequest(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"timeout": -1}, "timeout must be a non-negative int"),
        ({"model_version": 2.0}, "model_version must be an int"),
        ({"flags": 1.5}, "flags must be an int"),
        ({"requested_output_names": "OUT"}, "requested_output_names must be a list of str"),
    ],
)
def test_a_keyword_of_the_wrong_type_is_refused_naming_it(
    kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=words):
        _request(**kwargs)


def test_a_keyword_triton_does_not_know_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="priority"):
        _request(priority=1)


def test_what_inferd_cannot_honour_fails_the_call_naming_it() -> None:
    gpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)
    with pytest.raises(pb_utils.TritonModelException, match=r"preferred_memory.*MEMORY_CPU"):
        _request(preferred_memory=gpu).exec()
    with pytest.raises(pb_utils.TritonModelException, match="model_name must name"):
        _request(model_name="").exec()


def test_a_request_becomes_the_call_triton_would_make() -> None:
    request = _request(
        model_version=3,
        correlation_id=9,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=2500,
        parameters={"k": "v"},
        request_id="r1",
    )
    call = request._bls_call(decoupled=False)
    assert (call.model_name, call.model_version, call.request_id) == ("other", "3", "r1")
    assert call.output_names == ["OUT"] and list(call.inputs) == ["IN"]
    assert call.parameters == {"k": "v", "sequence_id": 9, "sequence_start": True}
    assert call.timeout_us == 2500
    every = _request(requested_output_names=[])._bls_call(decoupled=True)
    assert every.output_names is None and every.model_version == "" and every.decoupled
    assert _request(model_version="2")._bls_call(decoupled=False).model_version == "2"


def _ctx(deadline_ns: int | None, trace: str = "") -> CallContext:
    return CallContext(protocol="grpc", traceparent=trace, deadline_ns=deadline_ns)


def test_a_call_inherits_the_latest_deadline_and_the_first_trace_of_its_batch() -> None:
    callers = (Caller(_ctx(100), None), Caller(_ctx(300, "00-trace-01"), None))
    ctx = parent_context(callers, 0)
    assert (ctx.deadline_ns, ctx.traceparent, ctx.protocol) == (300, "00-trace-01", "grpc")
    # A request without a deadline: the call has none either (none is cut short).
    assert parent_context((*callers, Caller(_ctx(None), None)), 0).deadline_ns is None


def test_the_calls_own_timeout_only_tightens_the_deadline() -> None:
    now = time.perf_counter_ns()
    far = now + 60 * 10**9
    tightened = parent_context((Caller(_ctx(far), None),), 1000)
    assert tightened.deadline_ns is not None and now < tightened.deadline_ns < far
    near = now + 10**6
    assert parent_context((Caller(_ctx(near), None),), 10**9).deadline_ns == near
    alone = parent_context((), 1000)  # no request (a warm-up sample): the timeout alone
    assert alone.protocol == "bls" and alone.deadline_ns is not None


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("NOT_FOUND", pb_utils.TritonError.NOT_FOUND),
        ("INVALID_ARGUMENT", pb_utils.TritonError.INVALID_ARG),
        ("UNSUPPORTED", pb_utils.TritonError.UNSUPPORTED),
        ("DEADLINE_EXCEEDED", pb_utils.TritonError.UNAVAILABLE),
        ("RESOURCE_EXHAUSTED", pb_utils.TritonError.UNAVAILABLE),
        ("CANCELLED", pb_utils.TritonError.CANCELLED),
        ("MODEL_ERROR", pb_utils.TritonError.INTERNAL),
    ],
)
def test_a_failed_call_is_an_error_response(kind: str, code: int) -> None:
    response = bls_response(BlsResult(None, kind, "why"))
    error = response.error()
    assert response.has_error() and error is not None
    assert (error.code(), error.message()) == (code, "why")


def test_a_stream_of_results_iterates_as_responses() -> None:
    results = [
        BlsResult({"OUT": np.array([1.0])}, final=False),
        BlsResult(None, final=True),  # the final flag alone: an empty response
    ]
    responses = list(ResponseIterator(iter(results)))
    assert [len(r.output_tensors()) for r in responses] == [1, 0]
    out = pb_utils.get_output_tensor_by_name(responses[0], "OUT")
    assert out is not None and out.as_numpy().tolist() == [1.0]
