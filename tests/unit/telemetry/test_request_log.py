"""The request log sink, the log formats and traceparent parsing, without a server."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import numpy as np
import pytest

from inferd import log as inferd_log
from inferd.events import CallContext, ExecutionTimes, RequestRecord
from inferd.telemetry import tracing
from inferd.telemetry.request_log import RequestLogSink, input_fingerprint
from inferd.telemetry.tracing import TraceContext, parse_traceparent
from inferd.types import InferRequest, Tensor

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

# -- parse_traceparent ---------------------------------------------------------------------


def test_parse_valid_traceparent() -> None:
    assert parse_traceparent(TRACEPARENT) == TraceContext(TRACE_ID, PARENT_ID, "01")
    parsed = parse_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-00")
    assert parsed is not None and not parsed.sampled
    assert parse_traceparent(f"  {TRACEPARENT}\t") == TraceContext(TRACE_ID, PARENT_ID, "01")


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        f"01-{TRACE_ID}-{PARENT_ID}-01",  # an unknown version
        f"ff-{TRACE_ID}-{PARENT_ID}-01",  # the forbidden version
        f"00-{'0' * 32}-{PARENT_ID}-01",  # an all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # an all-zero parent id
        f"00-{TRACE_ID.upper()}-{PARENT_ID}-01",  # uppercase hex
        f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",  # a short trace id
        f"00-{TRACE_ID}0-{PARENT_ID}-01",  # a long trace id
        f"00-{TRACE_ID}-{PARENT_ID[:-1]}-01",  # a short parent id
        f"00-{TRACE_ID}-{PARENT_ID}-1",  # a short flags field
        f"00-{TRACE_ID}-{PARENT_ID}-0g",  # non-hex flags
        f"00-{TRACE_ID[:-1]}x-{PARENT_ID}-01",  # non-hex trace id
        f"00-{TRACE_ID}-{PARENT_ID}-01-extra",  # trailing fields (not allowed in 00)
        f"00_{TRACE_ID}_{PARENT_ID}_01",  # wrong separators
        "\u00e9" * 55,
    ],
)
def test_parse_invalid_traceparent(header: str) -> None:
    assert parse_traceparent(header) is None


def test_parse_traceparent_never_raises_on_non_strings() -> None:
    assert parse_traceparent(None) is None
    assert parse_traceparent(b"00-" + TRACE_ID.encode()) is None


def test_echo_keeps_trace_and_flags_with_a_new_span() -> None:
    ctx = CallContext("http", traceparent=TRACEPARENT, start_ns=12345)
    echoed = parse_traceparent(tracing.echo(ctx))
    assert echoed is not None
    assert echoed.trace_id == TRACE_ID and echoed.flags == "01"
    assert echoed.parent_id != PARENT_ID
    assert echoed.parent_id == tracing.server_span_id(ctx)  # what TraceSink will use
    other = CallContext("http", traceparent=TRACEPARENT, start_ns=12346)
    assert tracing.server_span_id(other) != echoed.parent_id


def test_no_or_invalid_traceparent_echoes_nothing() -> None:
    assert tracing.echo(CallContext("http")) == ""
    assert tracing.echo(CallContext("grpc", traceparent="00-bad")) == ""


# -- the request log sink ------------------------------------------------------------------


def make_record(
    failure: str | None = None,
    traceparent: str = "",
    data: np.ndarray | None = None,
) -> RequestRecord:
    x = data if data is not None else np.arange(8, dtype=np.float32).reshape(2, 4)
    request = InferRequest("mlp", "", [Tensor("INPUT0", "FP32", tuple(x.shape), x)], id="req-7")
    ctx = CallContext(
        "http", "127.0.0.1:5555", traceparent, wall_start_s=1_700_000_000.25, start_ns=99
    )
    return RequestRecord(
        model="mlp",
        version="1",
        ctx=ctx,
        duration_ns=2_500_000,
        request_id="req-7",
        failure=failure,
        message="" if failure is None else "something went wrong",
        rows=2,
        times=ExecutionTimes(queue_ns=500_000, compute_infer_ns=1_000_000, batch_rows=6),
        request=request,
    )


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Iterator[Captured]:
    handler = Captured()
    logger = logging.getLogger("test.requests")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield handler
    logger.handlers.clear()


def test_sample_rate_zero_logs_no_successes(captured: Captured) -> None:
    sink = RequestLogSink(0.0, "test.requests")
    for _ in range(200):
        sink.on_request(make_record())
    assert captured.records == []


def test_sample_rate_one_logs_every_success(captured: Captured) -> None:
    sink = RequestLogSink(1.0, "test.requests")
    for _ in range(50):
        sink.on_request(make_record())
    assert len(captured.records) == 50
    assert {r.levelno for r in captured.records} == {logging.INFO}


@pytest.mark.parametrize(
    ("reason", "level"),
    [
        ("invalid_input", logging.WARNING),
        ("not_found", logging.WARNING),
        ("cancelled", logging.INFO),  # the client went away: nothing for an operator to fix
        ("unavailable", logging.WARNING),
        ("timeout", logging.WARNING),
        ("model_error", logging.ERROR),
        ("internal", logging.ERROR),
    ],
)
def test_failures_are_always_logged(captured: Captured, reason: str, level: int) -> None:
    sink = RequestLogSink(0.0, "test.requests")
    sink.on_request(make_record(failure=reason))
    [line] = captured.records
    assert line.levelno == level
    assert line.reason == reason  # type: ignore[attr-defined]
    assert line.status == "failure"  # type: ignore[attr-defined]
    assert "something went wrong" in line.getMessage()


def test_shed_requests_are_sampled_like_successes(captured: Captured) -> None:
    RequestLogSink(0.0, "test.requests").on_request(make_record(failure="rejected"))
    assert captured.records == []
    RequestLogSink(1.0, "test.requests").on_request(make_record(failure="rejected"))
    [line] = captured.records
    assert line.levelno == logging.WARNING
    assert line.reason == "rejected"  # type: ignore[attr-defined]


def test_bad_sample_rate_is_refused() -> None:
    with pytest.raises(ValueError):
        RequestLogSink(1.5)
    with pytest.raises(ValueError):
        RequestLogSink(-0.1)


def test_on_batch_does_nothing(captured: Captured) -> None:
    from inferd.events import BatchRecord

    RequestLogSink(1.0, "test.requests").on_batch(
        BatchRecord("mlp", "1", 2, 1, "full", 0, 0, 0, False)
    )
    assert captured.records == []


def format_with(fmt: str, record: RequestRecord) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(inferd_log.formatter(fmt))
    logger = logging.getLogger("test.requests.formatted")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        RequestLogSink(1.0, "test.requests.formatted").on_request(record)
    finally:
        logger.handlers.clear()
    return stream.getvalue()


def test_json_line_has_every_field() -> None:
    text = format_with("json", make_record(traceparent=TRACEPARENT))
    assert text.endswith("\n") and text.count("\n") == 1
    doc = json.loads(text)
    assert doc["timestamp"] == "2023-11-14T22:13:20.250Z"  # the request's arrival, UTC
    assert doc["level"] == "INFO"
    assert doc["logger"] == "test.requests.formatted"
    assert "mlp" in doc["message"]
    assert doc["request_id"] == "req-7"
    assert doc["trace_id"] == TRACE_ID
    assert len(doc["span_id"]) == 16
    assert doc["model"] == "mlp"
    assert doc["version"] == "1"
    assert doc["status"] == "success"
    assert doc["reason"] is None
    assert doc["error"] == ""
    assert doc["latency_ms"] == 2.5
    assert doc["queue_ms"] == 0.5
    assert doc["batch_size"] == 6
    assert doc["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4]}]
    assert len(doc["input_fingerprint"]) == 16
    int(doc["input_fingerprint"], 16)
    assert doc["client"] == "127.0.0.1:5555"
    assert doc["protocol"] == "http"


def test_json_line_of_a_failure_without_trace() -> None:
    record = make_record(failure="model_error")
    record.times = None
    doc = json.loads(format_with("json", record))
    assert doc["level"] == "ERROR"
    assert doc["status"] == "failure"
    assert doc["reason"] == "model_error"
    assert doc["error"] == "something went wrong"
    assert doc["trace_id"] == ""
    assert doc["queue_ms"] is None and doc["batch_size"] is None


def test_text_line_appends_fields() -> None:
    text = format_with("text", make_record(traceparent=TRACEPARENT))
    assert text.count("\n") == 1
    assert "INFO" in text and "test.requests.formatted:" in text
    assert f"trace_id={TRACE_ID}" in text
    assert "request_id=req-7" in text
    assert "model=mlp" in text
    assert "latency_ms=2.5" in text
    assert "reason=" not in text  # empty fields are left out


def test_json_formatter_plain_lines_extras_and_exceptions() -> None:
    formatter = inferd_log.JsonFormatter()
    logger = logging.getLogger("inferd.model.foo")
    record = logger.makeRecord(
        logger.name, logging.INFO, __file__, 1, "hello %s", ("world",), None, extra={"model": "foo"}
    )
    doc = json.loads(formatter.format(record))
    assert doc["message"] == "hello world"
    assert doc["model"] == "foo"
    assert doc["logger"] == "inferd.model.foo"
    assert doc["timestamp"].endswith("Z") and "T" in doc["timestamp"]
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    doc = json.loads(formatter.format(record))
    assert doc["level"] == "ERROR"
    assert "RuntimeError: boom" in doc["exception"]


def test_configure_json_makes_inferd_lines_json(capsys: pytest.CaptureFixture[str]) -> None:
    loggers = [logging.getLogger(name) for name in ("inferd", "uvicorn")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    try:
        inferd_log.configure("INFO", "json")
        logging.getLogger("inferd.test").info("configured", extra={"model": "m"})
        doc = json.loads(capsys.readouterr().err)
        assert doc["message"] == "configured" and doc["model"] == "m"
        with pytest.raises(ValueError):
            inferd_log.configure("INFO", "yaml")
    finally:
        for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


# -- the input fingerprint -----------------------------------------------------------------


def tensors(*arrays: np.ndarray, datatype: str = "FP32") -> list[Tensor]:
    return [Tensor(f"IN{i}", datatype, tuple(a.shape), a) for i, a in enumerate(arrays)]


def test_fingerprint_equal_for_equal_inputs() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert input_fingerprint(tensors(a)) == input_fingerprint(tensors(a.copy()))
    # Non-contiguous data hashes like its contiguous copy.
    t = np.arange(12, dtype=np.float32).reshape(4, 3).T
    assert input_fingerprint(tensors(t)) == input_fingerprint(tensors(np.ascontiguousarray(t)))


def test_fingerprint_differs_for_different_inputs() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    base = input_fingerprint(tensors(a))
    changed = a.copy()
    changed[2, 3] = -1
    assert input_fingerprint(tensors(changed)) != base
    assert input_fingerprint(tensors(a.reshape(4, 3))) != base  # same bytes, other shape
    assert input_fingerprint(tensors(a, datatype="INT32")) != base  # other datatype
    renamed = [Tensor("OTHER", "FP32", a.shape, a)]
    assert input_fingerprint(renamed) != base


def test_fingerprint_of_bytes_tensors() -> None:
    def fp(*items: object) -> str:
        return input_fingerprint(tensors(np.array(items, dtype=object), datatype="BYTES"))

    assert fp(b"ab", b"c") == fp(b"ab", b"c")
    assert fp(b"ab", b"c") != fp(b"a", b"bc")  # element boundaries count
    assert fp("x") == fp(b"x")  # str elements hash as their UTF-8


def test_logged_fingerprint_tracks_the_data(captured: Captured) -> None:
    sink = RequestLogSink(1.0, "test.requests")
    sink.on_request(make_record())
    sink.on_request(make_record())
    sink.on_request(make_record(data=np.ones((2, 4), dtype=np.float32)))
    fps = [r.input_fingerprint for r in captured.records]  # type: ignore[attr-defined]
    assert fps[0] == fps[1] != fps[2]


def test_a_degraded_requests_line_names_its_tier_and_action(captured: Captured) -> None:
    sink = RequestLogSink(1.0, "test.requests")
    record = make_record()
    record.degraded_tier, record.degraded_action = 2, "fallback"
    sink.on_request(record)
    sink.on_request(make_record())
    degraded, plain = captured.records
    assert (degraded.degradation_tier, degraded.degradation_action) == (2, "fallback")  # type: ignore[attr-defined]
    assert not hasattr(plain, "degradation_tier")
