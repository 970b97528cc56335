"""An InferCall (dataplane/unary_request.py): in flight within its `with`, and its record told to
telemetry at the end whether the adapter's steps inside succeeded or failed; a StreamCall
as one, unless its record was handed to a decoupled stream (told once, when it ends) or
dropped for its fallback model's call."""

from __future__ import annotations

import time

import pytest

from inferd.dataplane.request_gate import RequestGate
from inferd.dataplane.unary_request import InferCall, StreamCall
from inferd.errors import invalid
from inferd.events import BatchRecord, CallContext, RequestRecord, Telemetry


class Records:
    """A telemetry sink that keeps what it is told."""

    def __init__(self) -> None:
        self.requests: list[RequestRecord] = []

    def on_request(self, record: RequestRecord) -> None:
        self.requests.append(record)

    def on_batch(self, record: BatchRecord) -> None:
        pass


class Owner(RequestGate):
    """The DataPlane's gate, with its telemetry's records at hand."""

    def __init__(self) -> None:
        self.sink = Records()
        super().__init__(Telemetry([self.sink]))


def _ctx() -> CallContext:
    return CallContext("http", "127.0.0.1:1", "", time.time(), time.perf_counter_ns())


def test_in_flight_within_the_with_and_recorded_once_after() -> None:
    owner = Owner()
    with InferCall(owner, "m", "", _ctx()) as call:
        assert owner.inflight == 1
        assert owner.sink.requests == []
        call.record.model = "m"
    assert owner.inflight == 0
    assert [(r.model, r.failure) for r in owner.sink.requests] == [("m", None)]
    assert owner.sink.requests[0].duration_ns > 0


def test_a_failure_inside_is_recorded_and_raised() -> None:
    owner = Owner()
    with pytest.raises(Exception, match="malformed"), InferCall(owner, "m", "", _ctx()):
        raise invalid("malformed JSON request")  # an adapter's decode, between the steps
    assert owner.inflight == 0
    (record,) = owner.sink.requests
    assert (record.failure, record.message) == ("invalid_input", "malformed JSON request")


def test_a_stream_call_is_an_infer_call_until_handed_over() -> None:
    owner = Owner()
    with pytest.raises(Exception, match="malformed"), StreamCall(owner, "m", "", _ctx()):
        raise invalid("malformed JSON request")
    assert owner.inflight == 0
    assert [r.failure for r in owner.sink.requests] == ["invalid_input"]


def test_a_handed_over_record_is_told_once_when_the_stream_ends() -> None:
    owner = Owner()
    with StreamCall(owner, "m", "", _ctx()) as call:
        call.hand_over()
    # The `with` has ended, the stream has not: still in flight, not yet told.
    assert owner.inflight == 1
    assert owner.sink.requests == []
    call.record.duration_ns = 7  # the stream fills its record in
    call.told()
    assert owner.inflight == 0
    assert [r.duration_ns for r in owner.sink.requests] == [7]


def test_a_dropped_call_leaves_flight_at_once_and_is_never_told() -> None:
    owner = Owner()
    with (
        pytest.raises(Exception, match="fallback failed"),
        StreamCall(owner, "m", "", _ctx()) as call,
    ):
        call.drop()  # the fallback model's own call counts the request
        assert owner.inflight == 0
        raise invalid("fallback failed")
    assert owner.inflight == 0
    assert owner.sink.requests == []
