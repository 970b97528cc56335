"""inferd's `triton_python_backend_utils`: the names and behaviour Triton models rely on."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from inferd.backends import pb_utils
from inferd.streams import CollectingSink

CONFIG = {
    "name": "m",
    "input": [{"name": "A", "data_type": "TYPE_INT32", "dims": [2]}],
    "output": [{"name": "B", "data_type": "TYPE_STRING", "dims": [1]}],
}


def test_config_lookups_and_type_names() -> None:
    assert pb_utils.get_input_config_by_name(CONFIG, "A") == CONFIG["input"][0]
    assert pb_utils.get_input_config_by_name(CONFIG, "B") is None
    out = pb_utils.get_output_config_by_name(CONFIG, "B")
    assert out is not None
    assert pb_utils.triton_string_to_numpy(out["data_type"]) is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(9) is np.int64


def test_tensor_request_and_response() -> None:
    t = pb_utils.Tensor("A", np.arange(6, dtype=np.int32).reshape(2, 3))
    assert t.name() == "A" and t.shape() == [2, 3] and t.triton_dtype() == 8 and t.is_cpu()
    request = pb_utils.InferenceRequest(inputs=[t], request_id="7", requested_output_names=["B"])
    assert pb_utils.get_input_tensor_by_name(request, "A") is t
    assert pb_utils.get_input_tensor_by_name(request, "C") is None
    assert request.request_id() == "7" and request.requested_output_names() == ["B"]
    response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("B", np.array([b"x"]))])
    assert not response.has_error() and response.error() is None
    assert pb_utils.get_output_tensor_by_name(response, "B") is not None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("bad"))
    assert failed.has_error() and failed.output_tensors() == []
    error = failed.error()
    assert error is not None and error.message() == "bad"
    assert error.code() == pb_utils.TritonError.INTERNAL


def test_what_triton_rejects_is_rejected() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="np.object_"):
        pb_utils.Tensor("S", np.array(["a"]))
    with pytest.raises(pb_utils.TritonModelException, match="must be a list"):
        pb_utils.InferenceResponse(output_tensors="nope")  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="BLS"):
        pb_utils.InferenceRequest(model_name="other").exec()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        pb_utils.InferenceRequest().get_response_sender()


def test_dlpack_round_trip_through_torch() -> None:
    original = np.arange(4, dtype=np.float32)
    original.flags.writeable = False  # request inputs are read-only views
    capsule = pb_utils.Tensor("A", original).to_dlpack()
    back = pb_utils.Tensor.from_dlpack("B", capsule)
    assert back.name() == "B"
    np.testing.assert_array_equal(back.as_numpy(), original)


def test_logger_levels(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="inferd.model"):
        pb_utils.Logger.log_info("i")
        pb_utils.Logger.log_warn("w")
        pb_utils.Logger.log_error("e")
        pb_utils.Logger.log_verbose("v")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "i"),
        ("WARNING", "w"),
        ("ERROR", "e"),
        ("DEBUG", "v"),
    ]


def test_the_response_sender_follows_tritons_rules() -> None:
    sink = CollectingSink()
    seen: list[pb_utils.InferenceResponse] = []

    def outputs(response: pb_utils.InferenceResponse) -> dict[str, np.ndarray]:
        seen.append(response)
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    sender = pb_utils.InferenceResponseSender(sink, outputs)
    request = pb_utils.InferenceRequest(parameters={"max_tokens": 3})
    request._sender = sender
    assert request.get_response_sender() is sender
    assert json.loads(request.parameters()) == {"max_tokens": 3}
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(flags=2)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match="InferenceResponse"):
        sender.send("not a response")  # type: ignore[arg-type]
    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1.0]))])
    sender.send(response)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(response)
    assert [item.final for item in sink.items] == [False, True]
    assert sink.items[0].outputs is not None and seen[0] is response
    assert not sender.is_cancelled() and not request.is_cancelled()
