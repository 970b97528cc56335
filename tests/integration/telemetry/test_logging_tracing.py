"""Request logs, the traceparent echo and OTLP span export, against a real server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.telemetry.request_log import RequestLogSink
from inferd.telemetry.tracing import parse_traceparent
from tests.support.servers import RunningServer
from tests.support.trace_collector import (
    PARENT_ID,
    TRACE_ID,
    TRACEPARENT,
    Captured,
    Collector,
    added,
    attrs,
)

pytest.importorskip("opentelemetry.sdk.trace", reason="tracing tests need inferd[otel]")

from pathlib import Path

import pytest

from inferd.telemetry.tracing import TraceSink  # noqa: E402
from tests.support.servers import run_server


@pytest.fixture(scope="module")
def running(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository) as server:
        yield server


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


BODY = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}


@pytest.fixture(scope="module")
def stub(running: RunningServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(running.grpc_address)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def grpc_request(model: str = "counter") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, id="g1")
    req.inputs.add(name="IN", datatype="FP32", shape=[1, 3])
    req.raw_input_contents.append(np.array([[1, 2, 3]], dtype=np.float32).tobytes())
    return req


# -- the traceparent echo ------------------------------------------------------------------


def test_http_echoes_traceparent(running: RunningServer) -> None:
    with running.client() as c:
        r = c.post("/v2/models/counter/infer", json=BODY, headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200
    echoed = parse_traceparent(r.headers["traceparent"])
    assert echoed is not None
    assert echoed.trace_id == TRACE_ID
    assert echoed.parent_id != PARENT_ID
    assert echoed.flags == "01"


def test_http_echo_on_binary_and_error_responses(running: RunningServer) -> None:
    body = {**BODY, "parameters": {"binary_data_output": True}}
    headers = {"traceparent": TRACEPARENT}
    with running.client() as c:
        binary = c.post("/v2/models/counter/infer", json=body, headers=headers)
        missing = c.post("/v2/models/no_such_model/infer", json=BODY, headers=headers)
        bad = c.post("/v2/models/counter/infer", content=b"{not json", headers=headers)
    assert binary.status_code == 200 and "inference-header-content-length" in binary.headers
    assert missing.status_code == 404 and bad.status_code == 400
    for r in (binary, missing, bad):
        echoed = parse_traceparent(r.headers["traceparent"])
        assert echoed is not None and echoed.trace_id == TRACE_ID
        assert echoed.parent_id != PARENT_ID


def test_http_without_valid_traceparent_gets_none(running: RunningServer) -> None:
    with running.client() as c:
        plain = c.post("/v2/models/counter/infer", json=BODY)
        invalid = c.post(
            "/v2/models/counter/infer", json=BODY, headers={"traceparent": "00-nonsense-01"}
        )
        missing = c.post("/v2/models/no_such_model/infer", json=BODY)
    assert plain.status_code == invalid.status_code == 200
    assert missing.status_code == 404
    for r in (plain, invalid, missing):
        assert "traceparent" not in r.headers


def test_grpc_echoes_traceparent(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    response, call = stub.ModelInfer.with_call(
        grpc_request(), metadata=(("traceparent", TRACEPARENT),)
    )
    assert response.id == "g1"
    metadata = dict(call.initial_metadata()) | dict(call.trailing_metadata())
    echoed = parse_traceparent(metadata["traceparent"])
    assert echoed is not None
    assert echoed.trace_id == TRACE_ID
    assert echoed.parent_id != PARENT_ID
    assert echoed.flags == "01"


def test_grpc_echo_on_error(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(grpc_request("no_such_model"), metadata=(("traceparent", TRACEPARENT),))
    error: Any = info.value
    assert error.code() == grpc.StatusCode.NOT_FOUND
    echoed = parse_traceparent(dict(error.trailing_metadata())["traceparent"])
    assert echoed is not None and echoed.trace_id == TRACE_ID


def test_grpc_without_traceparent_gets_none(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    _, call = stub.ModelInfer.with_call(grpc_request())
    metadata = dict(call.initial_metadata()) | dict(call.trailing_metadata())
    assert "traceparent" not in metadata


# -- the request log -----------------------------------------------------------------------


@pytest.fixture
def request_log(running: RunningServer) -> Iterator[Captured]:
    handler = Captured()
    logger = logging.getLogger("test.integration.requests")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    with added(running, RequestLogSink(1.0, logger.name)):
        yield handler
    logger.handlers.clear()


def test_request_log_lines_carry_the_trace_id(
    running: RunningServer,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    request_log: Captured,
) -> None:
    with running.client() as c:
        ok = c.post("/v2/models/counter/infer", json=BODY, headers={"traceparent": TRACEPARENT})
        bad = c.post("/v2/models/counter/infer", json={"inputs": []})
    assert ok.status_code == 200 and bad.status_code == 400
    stub.ModelInfer(grpc_request())
    lines: list[Any] = list(request_log.records)
    assert len(lines) == 3
    by_protocol = {(r.protocol, r.status): r for r in lines}
    traced = by_protocol[("http", "success")]
    assert traced.trace_id == TRACE_ID
    assert traced.span_id == parse_traceparent(ok.headers["traceparent"]).parent_id  # type: ignore[union-attr]
    assert traced.model == "counter" and traced.version == "1"
    assert traced.inputs == [{"name": "IN", "datatype": "FP32", "shape": [1, 3]}]
    assert traced.batch_size >= 1
    assert traced.client.startswith("127.0.0.1:")
    failed = by_protocol[("http", "failure")]
    assert failed.levelno == logging.WARNING and failed.reason == "invalid_input"
    assert failed.trace_id == ""
    via_grpc = by_protocol[("grpc", "success")]
    assert via_grpc.request_id == "g1"
    # The same input over both protocols has the same fingerprint.
    assert via_grpc.input_fingerprint == traced.input_fingerprint


# -- OTLP export ---------------------------------------------------------------------------


@pytest.fixture
def trace_sink(running: RunningServer, collector: Collector) -> Iterator[TraceSink]:
    sink = TraceSink(collector.endpoint)
    try:
        with added(running, sink):
            yield sink
    finally:
        sink.shutdown()


def test_spans_reach_the_collector(
    running: RunningServer,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    collector: Collector,
    trace_sink: TraceSink,
) -> None:
    other_trace = "0af7651916cd43dd8448eb211c80319c"
    with running.client() as c:
        ok = c.post("/v2/models/counter/infer", json=BODY, headers={"traceparent": TRACEPARENT})
        c.post("/v2/models/counter/infer", json=BODY)  # no traceparent: a trace of its own
    _, call = stub.ModelInfer.with_call(
        grpc_request(), metadata=(("traceparent", f"00-{other_trace}-{PARENT_ID}-01"),)
    )
    with pytest.raises(grpc.RpcError):
        stub.ModelInfer(grpc_request("no_such_model"))
    assert trace_sink.force_flush()

    spans = collector.spans()
    servers = [s for s in spans if s.name.startswith("inferd.infer")]
    assert len(servers) == 4
    by_trace: dict[str, list[Any]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id.hex(), []).append(span)

    # The HTTP request: parented to the client's span, with the echoed span id.
    http_echo = parse_traceparent(ok.headers["traceparent"])
    assert http_echo is not None
    tree = by_trace[TRACE_ID]
    [server] = [s for s in tree if s.name == "inferd.infer counter"]
    assert server.parent_span_id.hex() == PARENT_ID
    assert server.span_id.hex() == http_echo.parent_id
    assert server.kind == server.SPAN_KIND_SERVER
    a = attrs(server)
    assert a["inferd.model"] == "counter" and a["inferd.version"] == "1"
    assert a["inferd.status"] == "success" and a["inferd.protocol"] == "http"
    assert "inferd.request_id" in a
    children = {s.name: s for s in tree if s is not server}
    assert set(children) == {"queue", "execute", "respond"}
    for child in children.values():
        assert child.parent_span_id == server.span_id
        assert server.start_time_unix_nano <= child.start_time_unix_nano
        assert child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= server.end_time_unix_nano
    assert attrs(children["execute"])["inferd.batch_size"] >= 1
    q, e, r = children["queue"], children["execute"], children["respond"]
    assert q.end_time_unix_nano <= e.start_time_unix_nano <= e.end_time_unix_nano
    assert e.end_time_unix_nano <= r.start_time_unix_nano

    # The gRPC request: its own client trace, the echoed id in the trailing metadata.
    grpc_echo = parse_traceparent(dict(call.trailing_metadata())["traceparent"])
    assert grpc_echo is not None
    [grpc_server] = [s for s in by_trace[other_trace] if s.name.startswith("inferd.infer")]
    assert grpc_server.span_id.hex() == grpc_echo.parent_id
    assert attrs(grpc_server)["inferd.protocol"] == "grpc"

    # Requests without a traceparent start root spans of new traces.
    roots = [s for s in servers if not s.parent_span_id]
    assert len(roots) == 2
    assert {s.trace_id.hex() for s in roots}.isdisjoint({TRACE_ID, other_trace})
    [failed] = [s for s in roots if s.name == "inferd.infer"]  # an unknown model
    assert attrs(failed)["inferd.status"] == "failure"
    assert attrs(failed)["inferd.reason"] == "not_found"
    assert failed.status.code == failed.status.STATUS_CODE_ERROR


def test_unsampled_client_traces_export_nothing(
    running: RunningServer, collector: Collector, trace_sink: TraceSink
) -> None:
    with running.client() as c:
        r = c.post(
            "/v2/models/counter/infer",
            json=BODY,
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"},
        )
    assert parse_traceparent(r.headers["traceparent"]).flags == "00"  # type: ignore[union-attr]
    assert trace_sink.force_flush()
    assert collector.spans() == []
