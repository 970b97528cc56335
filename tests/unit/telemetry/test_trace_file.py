"""Triton's trace file from request records: the timestamps, which file each trace goes to
(log frequency, count, shutdown), ensemble steps under their ensemble, and what is dropped
and counted instead of waiting (a full queue, a file that cannot be written). Real files,
real writer thread; the integration tests send the requests over HTTP and gRPC."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferd.events import CallContext, ExecutionTimes, RequestRecord
from inferd.metrics.trace_families import TraceFileCollector
from inferd.telemetry.trace_config import TraceConfig
from inferd.telemetry.trace_file import NAMES, TraceFileSink, timestamps
from inferd.telemetry.trace_settings import TraceSettings

START = 1_000_000


def record(
    model: str = "m",
    times: ExecutionTimes | None = None,
    caller: CallContext | None = None,
    ctx: CallContext | None = None,
    request_id: str = "",
) -> RequestRecord:
    ctx = ctx if ctx is not None else CallContext("http", start_ns=START, caller=caller)
    return RequestRecord(
        model=model, version="1", ctx=ctx, duration_ns=9_000, request_id=request_id, times=times
    )


def ran() -> ExecutionTimes:
    """Queued 1000 ns, its batch started at START + 3000: input 100, infer 2000, output 300."""
    return ExecutionTimes(
        queue_ns=1_000,
        compute_input_ns=100,
        compute_infer_ns=2_000,
        compute_output_ns=300,
        compute_start_ns=START + 3_000,
    )


def test_timestamps_of_a_request_that_ran_in_a_batch() -> None:
    stamps = timestamps(record(times=ran()))
    assert dict(zip(NAMES, stamps, strict=True)) == {
        "REQUEST_START": START,
        "QUEUE_START": START + 2_000,
        "COMPUTE_START": START + 3_000,
        "COMPUTE_INPUT_END": START + 3_100,
        "COMPUTE_OUTPUT_START": START + 5_100,
        "COMPUTE_END": START + 5_400,
        "REQUEST_END": START + 9_000,
    }


def test_timestamps_of_a_request_that_never_ran_are_its_ends() -> None:
    assert timestamps(record()) == (START, START + 9_000)
    ensemble = ExecutionTimes(compute_infer_ns=5_000)  # an ensemble's: no batch of its own
    assert timestamps(record(times=ensemble)) == (START, START + 9_000)


def test_timestamps_never_go_back_nor_past_the_end() -> None:
    odd = ExecutionTimes(queue_ns=10**9, compute_output_ns=10**9, compute_start_ns=START + 10)
    stamps = timestamps(record(times=odd))
    assert list(stamps) == sorted(stamps)
    assert stamps[0] == START and stamps[-1] == START + 9_000


def sink(tmp_path: Path, **config: Any) -> tuple[TraceFileSink, Path]:
    path = tmp_path / "trace.json"
    options = {"level": "TIMESTAMPS", "rate": 1, **config}
    settings = TraceSettings(TraceConfig(file=str(path), **options))
    s = TraceFileSink(path, settings)
    s.start()
    return s, path


def read(path: Path) -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = json.loads(path.read_text())
    return traces


def written(tmp_path: Path) -> dict[str, list[int]]:
    """The files next to the trace file, with the ids of the traces each holds."""
    return {p.name: [t["id"] for t in read(p)] for p in sorted(tmp_path.glob("trace.json*"))}


def test_without_a_log_frequency_every_trace_goes_to_the_file_at_shutdown(
    tmp_path: Path,
) -> None:
    s, path = sink(tmp_path)
    for rid in ("a", "b", "c"):
        s.on_request(record(times=ran(), request_id=rid))
    s.close()
    traces = read(path)
    assert [(t["id"], t["request_id"], t["model_name"], t["model_version"]) for t in traces] == [
        (1, "a", "m", 1),
        (2, "b", "m", 1),
        (3, "c", "m", 1),
    ]
    assert [ts["name"] for ts in traces[0]["timestamps"]] == list(NAMES)
    assert "parent_id" not in traces[0]


def test_a_log_frequency_writes_numbered_files_every_n_traces(tmp_path: Path) -> None:
    s, _ = sink(tmp_path, log_frequency=2)
    for _ in range(5):
        s.on_request(record())
    assert s.flush()
    assert written(tmp_path) == {"trace.json.0": [1, 2], "trace.json.1": [3, 4]}
    s.close()  # the rest to a numbered file too, as Triton's
    assert written(tmp_path) == {
        "trace.json.0": [1, 2],
        "trace.json.1": [3, 4],
        "trace.json.2": [5],
    }


def test_the_last_trace_of_a_count_writes_its_file(tmp_path: Path) -> None:
    s, _ = sink(tmp_path, count=2)
    for _ in range(4):
        s.on_request(record())
    assert s.flush()
    assert written(tmp_path) == {"trace.json.0": [1, 2]}
    assert s.settings.view()["trace_count"] == "0"
    s.close()
    assert written(tmp_path) == {"trace.json.0": [1, 2]}


def test_rate_and_a_models_own_log_frequency(tmp_path: Path) -> None:
    s, path = sink(tmp_path, rate=2)
    s.settings.update("b", {"log_frequency": "1"})
    for model in ("a", "a", "a", "b", "b", "b"):  # b has no rate of its own: one counter
        s.on_request(record(model))
    s.close()
    assert written(tmp_path) == {"trace.json": [1, 2], "trace.json.0": [3]}
    assert [t["model_name"] for t in read(path)] == ["a", "a"]


def test_an_ensembles_steps_are_written_after_it_with_its_id_as_parent(tmp_path: Path) -> None:
    s, path = sink(tmp_path, rate=2)
    ensemble = CallContext("grpc", start_ns=START)
    for _ in range(2):  # the first ensemble request is traced, the second is not
        s.on_request(record("step1", ran(), caller=ensemble))
        s.on_request(record("step2", ran(), caller=ensemble))
        s.on_request(record("chain", ExecutionTimes(compute_infer_ns=1), ctx=ensemble))
    s.on_request(record("plain"))  # its own rate turn: the steps took none
    s.close()
    traces = read(path)
    assert [(t["id"], t.get("parent_id"), t["model_name"]) for t in traces] == [
        (1, None, "chain"),
        (2, 1, "step1"),
        (3, 1, "step2"),
        (4, None, "plain"),
    ]
    assert [ts["name"] for ts in traces[0]["timestamps"]] == ["REQUEST_START", "REQUEST_END"]


def test_a_writer_behind_drops_and_counts_without_spending_the_count(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    settings = TraceSettings(TraceConfig(level="TIMESTAMPS", rate=1, count=5, file=str(path)))
    s = TraceFileSink(path, settings, queue_traces=1)  # not started yet: nothing is taken
    s.on_request(record())
    s.on_request(record())
    assert s.writer.drops() == {"queue_full": 1}
    assert settings.view()["trace_count"] == "4"  # only the queued one spent it
    [family] = TraceFileCollector(s).collect()
    assert {x.labels["reason"]: x.value for x in family.samples} == {
        "queue_full": 1,
        "write_error": 0,
    }
    s.start()
    s.close()
    assert written(tmp_path) == {"trace.json": [1]}


def test_a_file_that_cannot_be_written_drops_and_counts(tmp_path: Path) -> None:
    directory = tmp_path / "gone"
    directory.mkdir()
    s, _ = sink(directory, log_frequency=1)
    directory.rmdir()
    s.on_request(record())
    s.on_request(record())
    assert s.flush()
    assert s.writer.drops() == {"write_error": 2}
    s.close()


def test_requests_no_model_answered_are_not_traced(tmp_path: Path) -> None:
    s, path = sink(tmp_path)
    s.on_request(record(model=""))
    s.close()
    assert not path.exists()


def test_level_off_writes_nothing(tmp_path: Path) -> None:
    s, path = sink(tmp_path, level="OFF")
    s.on_request(record())
    s.close()
    assert not path.exists()
