"""Triton's trace file (`--trace-config triton,file=PATH`): each traced request as one JSON
trace record, written by a background thread.

A record is Triton's trace, its timestamps in nanoseconds of the machine's monotonic clock
(Triton's steady clock; `time.perf_counter_ns` here, the same clock in every process):

    {"id": 7, "model_name": "mlp", "model_version": 1, "request_id": "",
     "timestamps": [{"name": "REQUEST_START", "ns": ...}, {"name": "QUEUE_START", ...},
                    COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END,
                    REQUEST_END]}

A request that never ran (refused, invalid, a cache hit) has REQUEST_START and REQUEST_END
alone, and so has an ensemble's own record; each of an ensemble's steps has a record of
its own with `"parent_id"`: the ensemble's id. Steps are traced when their ensemble is
(they count towards no rate or count of their own), as in Triton.

The event loop decides (TraceSettings: level, rate, count) and queues the trace's numbers,
never waiting: when the writer is `QUEUE_TRACES` behind, the trace is dropped and counted
(`drops`), and spends no count. The thread writes each trace to its place, as Triton:
with a log frequency N, the scope's traces are written N at a time as a JSON array to
`PATH.<n>` (n = 0, 1, ... for the whole file); when a trace count reaches 0, the traces
waiting in its scope are written the same way; everything else goes to `PATH`, one JSON
array, appended as it comes and closed at shutdown (so `PATH` is valid JSON once the
server has stopped). A file that cannot be written drops its traces (counted, logged at
most once a minute).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

from inferd.events import BatchRecord, RequestRecord
from inferd.telemetry.trace_config import UNLIMITED
from inferd.telemetry.trace_settings import TraceSettings
from inferd.telemetry.writer_thread import Flush, WriterThread

log = logging.getLogger("inferd.trace")

QUEUE_TRACES = 4096  # traces (with their steps) waiting for the writer, at most
OPEN_ENSEMBLES = 4096  # ensemble requests whose steps' records wait for theirs, at most
POLL_S = 0.25  # how often the writer looks at the queue when nobody wakes it
WARN_EVERY_S = 60.0
NAMES = (
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
)
ENDS = ("REQUEST_START", "REQUEST_END")

# One trace: id, parent id (0: none), model, version, request id, timestamps (ns).
Trace = tuple[int, int, str, str, str, tuple[int, ...]]


@dataclass(slots=True)
class _Draft:
    """A request's trace before it has an id (an ensemble's steps wait for the ensemble's
    record, which comes last)."""

    model: str
    version: str
    request_id: str
    stamps: tuple[int, ...]
    steps: list[_Draft]


@dataclass(slots=True)
class TraceBatch:
    """One traced request (and its steps): what the loop hands the writer."""

    scope: str  # where it waits for its file: "" the global scope, or a model's name
    log_frequency: int  # that scope's, when it was taken
    is_held: bool  # its count is limited: it waits, to be written when the count runs out
    is_last: bool  # it spent its scope's count to 0
    traces: list[Trace]


def timestamps(record: RequestRecord) -> tuple[int, ...]:
    """Triton's timestamps of `record`'s request, from what was measured: its arrival and
    end, and (when it ran in a batch) its batch's start and the durations of its parts.
    Each is at least the one before it."""
    start = record.ctx.start_ns
    end = start + max(record.duration_ns, 0)
    times = record.times
    if times is None or not times.compute_start_ns:
        return (start, end)
    compute_start = times.compute_start_ns
    queue_start = compute_start - times.queue_ns
    input_end = compute_start + times.compute_input_ns
    output_start = input_end + times.compute_infer_ns
    compute_end = output_start + times.compute_output_ns
    stamps = (start, queue_start, compute_start, input_end, output_start, compute_end, end)
    if start <= queue_start <= compute_start <= input_end <= output_start <= compute_end <= end:
        return stamps  # as measured: the durations are parts of the request's time
    return _ordered(stamps)


def _ordered(stamps: tuple[int, ...]) -> tuple[int, ...]:
    """`stamps` made non-decreasing and within the first and last."""
    end = stamps[-1]
    out = []
    last = stamps[0]
    for ns in stamps:
        last = min(max(ns, last), end)
        out.append(last)
    return tuple(out)


class TraceFileSink:
    """A telemetry sink: the traced requests' records, to a TraceFileWriter."""

    def __init__(
        self, path: str | Path, settings: TraceSettings, queue_traces: int = QUEUE_TRACES
    ) -> None:
        self.settings = settings
        self.writer = TraceFileWriter(Path(path), queue_traces)
        self._next_id = 1
        # Ensemble requests still running: the records of their finished steps, by the
        # ensemble's CallContext (kept here with them, so that its id stays its own).
        self._steps: dict[int, tuple[object, list[_Draft]]] = {}

    def start(self) -> None:
        self.writer.start()

    def on_request(self, record: RequestRecord) -> None:
        ctx = record.ctx
        steps = self._steps.pop(id(ctx), None) if self._steps else None
        caller = ctx.caller
        if caller is not None:  # a step of an ensemble: traced with it, or not at all
            draft = _draft(record, steps[1] if steps is not None else [])
            waiting = self._steps.get(id(caller))
            if waiting is not None:
                waiting[1].append(draft)
            elif len(self._steps) < OPEN_ENSEMBLES:
                self._steps[id(caller)] = (caller, [draft])
            else:
                self.writer.drop("queue_full", _records(draft))
            return
        if not record.model:  # not a model of the repository: no settings, no trace
            return
        chosen = self.settings.admit(record.model)
        if chosen is None:
            return
        draft = _draft(record, steps[1] if steps is not None else [])
        if self.writer.is_full():
            self.writer.drop("queue_full", _records(draft))
            return
        self.settings.spend(chosen)
        traces: list[Trace] = []
        self._number(draft, 0, traces)
        scope, log_frequency = self.settings.file_scope(record.model)
        count = chosen.count
        self.writer.offer(TraceBatch(scope, log_frequency, count != UNLIMITED, count == 0, traces))

    def on_batch(self, record: BatchRecord) -> None:
        pass

    def _number(self, draft: _Draft, parent_id: int, out: list[Trace]) -> None:
        """Ids for `draft` and its steps, parent first (Triton numbers them in that order)."""
        trace_id = self._next_id
        self._next_id += 1
        out.append(
            (trace_id, parent_id, draft.model, draft.version, draft.request_id, draft.stamps)
        )
        for step in draft.steps:
            self._number(step, trace_id, out)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait (never on the event loop) until what was traced so far is written."""
        return self.writer.flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is waiting and close the file. Blocking: off the event loop."""
        self.writer.close(timeout_s)


def _draft(record: RequestRecord, steps: list[_Draft]) -> _Draft:
    return _Draft(record.model, record.version, record.request_id, timestamps(record), steps)


def _records(draft: _Draft) -> int:
    return 1 + sum(_records(step) for step in draft.steps)


@dataclass(slots=True)
class _Waiting:
    """A scope's traces waiting for their file (encoded), and how many requests they are."""

    log_frequency: int = 0
    requests: int = 0
    traces: list[bytes] = field(default_factory=list)


class TraceFileWriter(WriterThread[TraceBatch]):
    """The bounded queue and the thread that writes `path` and `path.<n>`."""

    def __init__(self, path: Path, queue_traces: int = QUEUE_TRACES) -> None:
        self.path = path
        self.queue_traces = queue_traces
        # The writer polls. One producer (the loop): len() bounds the queue.
        super().__init__("inferd-trace-file", "the traces it holds are lost")
        self._drops_lock = threading.Lock()
        self._drops: dict[str, int] = {}
        # The thread's own.
        self._waiting: dict[str, _Waiting] = {}
        self._index = 0  # the next `path.<n>`
        self._main: BinaryIO | None = None  # `path`, once a trace went there
        self._warned_at = -WARN_EVERY_S

    # -- the event loop's side -----------------------------------------------------------

    def is_full(self) -> bool:
        return len(self._items) >= self.queue_traces

    def offer(self, batch: TraceBatch) -> None:
        self._items.append(batch)

    def drop(self, reason: str, n: int = 1) -> None:
        with self._drops_lock:
            self._drops[reason] = self._drops.get(reason, 0) + n

    def drops(self) -> dict[str, int]:
        """Trace records not written, by reason: queue_full (the writer was behind, or too
        many ensemble requests were open), write_error (the file could not be written)."""
        with self._drops_lock:
            return dict(self._drops)

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(POLL_S)
            self._wake.clear()
            while self._items:
                item = self._items.popleft()
                if item is None:
                    self._finish()
                    return
                if isinstance(item, Flush):
                    if self._main is not None:
                        self._write(self._main.flush, 0)
                    item.done.set()
                else:
                    self._take(item)

    def _take(self, batch: TraceBatch) -> None:
        encoded = [_encode(t) for t in batch.traces]
        if not batch.log_frequency and not batch.is_held:
            self._append_main(encoded)
            return
        waiting = self._waiting.setdefault(batch.scope, _Waiting())
        waiting.log_frequency = batch.log_frequency
        waiting.requests += 1
        waiting.traces += encoded
        if batch.is_last or (batch.log_frequency and waiting.requests >= batch.log_frequency):
            self._write_indexed(waiting.traces)
            waiting.requests, waiting.traces = 0, []

    def _finish(self) -> None:
        """At shutdown, as Triton: a scope's waiting traces to `path.<n>` if it has a log
        frequency, else to `path`; then `path`'s array is closed."""
        for waiting in self._waiting.values():
            if waiting.traces:
                if waiting.log_frequency:
                    self._write_indexed(waiting.traces)
                else:
                    self._append_main(waiting.traces)
        self._waiting.clear()
        main, self._main = self._main, None
        if main is not None:
            self._write(lambda: main.write(b"]"), 0)
            self._write(main.close, 0)

    def _append_main(self, traces: list[bytes]) -> None:
        def append() -> None:
            if self._main is None:
                self._main = self.path.open("wb")
                self._main.write(b"[")
            else:
                self._main.write(b",")
            self._main.write(b",".join(traces))

        self._write(append, len(traces))

    def _write_indexed(self, traces: list[bytes]) -> None:
        name = self.path.with_name(f"{self.path.name}.{self._index}")
        self._index += 1
        self._write(lambda: name.write_bytes(b"[" + b",".join(traces) + b"]"), len(traces))

    def _write(self, write: Callable[[], object], traces: int) -> None:
        try:
            write()
        except OSError as exc:  # a full disk, a removed directory: never the thread's end
            if traces:
                self.drop("write_error", traces)
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "trace file %s: cannot write (%s): %d traces dropped "
                    '(inferd_trace_dropped_total{reason="write_error"})',
                    self.path,
                    exc,
                    traces,
                )


def _encode(trace: Trace) -> bytes:
    trace_id, parent_id, model, version, request_id, stamps = trace
    names = NAMES if len(stamps) == len(NAMES) else ENDS
    record: dict[str, object] = {
        "id": trace_id,
        "model_name": model,
        "model_version": int(version) if version.isdigit() else version,
        "request_id": request_id,
    }
    if parent_id:
        record["parent_id"] = parent_id
    record["timestamps"] = [{"name": n, "ns": ns} for n, ns in zip(names, stamps, strict=True)]
    return orjson.dumps(record)
