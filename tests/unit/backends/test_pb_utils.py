"""inferd's `triton_python_backend_utils`: the names and behaviour Triton models rely on."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import numpy as np
import pytest

from inferd.backends.python import pb_utils
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
    with pytest.raises(pb_utils.TritonModelException, match="InferenceRequest.exec needs"):
        pb_utils.InferenceRequest(model_name="other").exec()  # outside a server
    with pytest.raises(pb_utils.TritonModelException, match="get_response_sender"):
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


def test_logger_levels_are_on_the_logger_as_in_triton(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="inferd.model"):
        pb_utils.Logger.log("default")
        pb_utils.Logger.log("verbose", pb_utils.Logger.VERBOSE)
        pb_utils.Logger.log("error", pb_utils.Logger.LogLevel.ERROR)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "default"),
        ("DEBUG", "verbose"),
        ("ERROR", "error"),
    ]


def test_triton_error_codes_and_their_checks() -> None:
    assert pb_utils.TritonError("x", pb_utils.TritonError.CANCELLED).code() == 7
    with pytest.raises(TypeError, match="not one of TritonError's codes"):
        pb_utils.TritonError("x", 99)
    with pytest.raises(TypeError, match="not None"):
        pb_utils.TritonError(None)  # type: ignore[arg-type]


def test_parameters_a_model_sets_follow_tritons_types() -> None:
    response = pb_utils.InferenceResponse(parameters={"a": 1, "b": "x", "c": True})
    assert response.parameters() == '{"a":1,"b":"x","c":true}'
    with pytest.raises(pb_utils.TritonModelException, match="parameter 'f' must be a bool"):
        pb_utils.InferenceResponse(parameters={"f": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="keys must be str"):
        pb_utils.InferenceRequest(parameters={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(correlation_id=1.5)  # type: ignore[arg-type]


def test_an_incoming_requests_parameters_json_is_made_when_asked() -> None:
    request = pb_utils.InferenceRequest.incoming([], "r", ["OUT"], {"k": 0.5}, 1000, None)
    assert request.parameters() == '{"k":0.5}'
    assert request.timeout() == 1000 and not request.is_cancelled()
    cancelled = pb_utils.InferenceRequest.incoming([], "r", [], {}, 0, lambda: True)
    assert cancelled.is_cancelled() and cancelled.parameters() == "{}"


def test_bytes_tensor_serialisation_round_trips() -> None:
    data = np.array([[b"ab", b""], ["c", b"\x00"]], dtype=object)
    wire = pb_utils.serialize_byte_tensor(data)
    assert isinstance(wire, bytes)
    assert list(pb_utils.deserialize_bytes_tensor(wire)) == [b"ab", b"", b"c", b"\x00"]
    assert pb_utils.serialize_byte_tensor(np.zeros(0, dtype=object)) == ()
    assert pb_utils.serialize_byte_tensor(np.zeros(2, np.float32)) is None
    with pytest.raises(pb_utils.TritonModelException, match="runs past the end"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


def test_dlpack_without_torch_for_objects_that_export_it() -> None:
    tensor = pb_utils.Tensor("A", np.arange(3, dtype=np.int64))
    assert tensor.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(tensor), [0, 1, 2])
    back = pb_utils.Tensor.from_dlpack("B", np.arange(2, dtype=np.float32))
    np.testing.assert_array_equal(back.as_numpy(), [0.0, 1.0])
    with pytest.raises(pb_utils.TritonModelException, match="BYTES tensors have no DLPack"):
        pb_utils.Tensor("S", np.array([b"x"], dtype=object)).to_dlpack()


COMPLETE_ME = json.dumps(
    {
        "name": "m",
        "max_batch_size": 8,
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [2], "optional": False}],
        "output": [],
    }
)


def test_model_config_fills_in_what_the_config_left_out() -> None:
    config = pb_utils.ModelConfig(COMPLETE_ME)
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # the same: fine
    config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1]})
    config.set_max_batch_size(16)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    doc = config.as_dict()
    assert [i["name"] for i in doc["input"]] == ["A", "B"] and doc["input"][1]["optional"]
    assert doc["output"] == [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]
    assert doc["max_batch_size"] == 16 and doc["dynamic_batching"] == {}
    assert doc["model_transaction_policy"] == {"decoupled": False}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda c: c.set_max_batch_size(4), "configuration specified max_batch_size 8"),
        (
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_INT8", "dims": [2]}),
            "configuration expects datatype TYPE_FP32 for input 'A', model provides TYPE_INT8",
        ),
        (
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]}),
            "the model expects dims [3] but the model configuration specifies dims [2]",
        ),
        (
            lambda c: c.add_input(
                {"name": "A", "data_type": "TYPE_FP32", "dims": [2], "optional": True}
            ),
            "the model expects optional True",
        ),
        (
            lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
            "contains property other than",
        ),
        (lambda c: c.add_output({"name": "Y", "dims": [1]}), "missing 'data_type' property"),
        (
            lambda c: c.set_model_transaction_policy({"streaming": True}),
            "contains property other than 'decoupled'",
        ),
    ],
    ids=["smaller batch", "dtype", "dims", "optional", "property", "missing", "policy"],
)
def test_model_config_refuses_what_contradicts_the_config(change: Any, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        change(pb_utils.ModelConfig(COMPLETE_ME))


def test_set_dynamic_batching_refuses_another_scheduler() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "sequence_batching": {}}))
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        config.set_dynamic_batching()


def test_calls_that_need_the_server_name_themselves_outside_one() -> None:
    for call, name in (
        (lambda: pb_utils.load_model("x"), "pb_utils.load_model"),
        (lambda: pb_utils.unload_model("x"), "pb_utils.unload_model"),
        (lambda: pb_utils.is_model_ready("x"), "pb_utils.is_model_ready"),
        (lambda: pb_utils.MetricFamily("m", "d", pb_utils.MetricFamily.GAUGE), "MetricFamily"),
        (pb_utils.get_model_dir, "pb_utils.get_model_dir"),
    ):
        with pytest.raises(pb_utils.TritonModelException, match=re.escape(name)):
            call()


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
