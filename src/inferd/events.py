"""What happened to each request and each batch, told once to every telemetry sink.

The core (DataPlane) and the scheduler (batcher) build these records; metrics, Triton
statistics, structured logs and traces are views of them. Adapters never count anything.
Sinks run on the event loop, inline: each must be cheap and must not block.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from inferd.errors import DeadlineUnmeetableError, ErrorKind, InferdError

if TYPE_CHECKING:
    from inferd.types import InferRequest

log = logging.getLogger("inferd.events")

# ErrorKind -> the `reason` label of a failed request (docs/metrics.md).
FAILURE_REASON: dict[ErrorKind, str] = {
    ErrorKind.INVALID_ARGUMENT: "invalid_input",
    ErrorKind.PAYLOAD_TOO_LARGE: "invalid_input",
    ErrorKind.NOT_FOUND: "not_found",
    ErrorKind.UNAUTHENTICATED: "invalid_input",
    ErrorKind.ALREADY_EXISTS: "invalid_input",
    ErrorKind.PERMISSION_DENIED: "invalid_input",
    ErrorKind.UNSUPPORTED: "invalid_input",
    ErrorKind.MODEL_ERROR: "model_error",
    ErrorKind.DEADLINE_EXCEEDED: "timeout",
    ErrorKind.RESOURCE_EXHAUSTED: "rejected",
    ErrorKind.UNAVAILABLE: "unavailable",
    ErrorKind.INTERNAL: "internal",
}
CANCELLED = "cancelled"


@dataclass(slots=True)
class CallContext:
    """Where a request came from; filled by the adapter, read by sinks."""

    protocol: str  # "http" or "grpc"
    client: str = ""  # "host:port" of the peer, when known
    traceparent: str = ""  # the W3C traceparent the client sent, if any
    wall_start_s: float = 0.0  # time.time() at arrival, for log timestamps
    start_ns: int = 0  # time.perf_counter_ns() at arrival
    routing_key: str = ""  # makes canary routing sticky (inferd-routing-key header/metadata)
    deadline_ns: int | None = None  # perf_counter_ns by which the client wants its answer
    # The traceparent was made by the server for a request that carried none (an ensemble's,
    # so that its steps' spans nest under its own): its span starts the trace, and nothing
    # is echoed to the client.
    trace_root: bool = False
    # A step of an ensemble: the context of the ensemble's request (the one its record
    # carries), which a Triton trace file names as the step's parent. None otherwise.
    caller: CallContext | None = None


@dataclass(slots=True)
class ExecutionTimes:
    """How the batch that carried a request went; attached to the request's record."""

    queue_ns: int = 0  # enqueued -> its batch left the queue
    compute_input_ns: int = 0  # merging the batch's inputs
    compute_infer_ns: int = 0  # the backend's execute
    compute_output_ns: int = 0  # splitting outputs back per request
    batch_rows: int = 0
    batch_requests: int = 0
    # perf_counter_ns when its batch left the queue (Triton's COMPUTE_START, for trace
    # files); 0 when it did not run in a batch of its own (an ensemble's steps did).
    compute_start_ns: int = 0


@dataclass(frozen=True, slots=True)
class ResponseTimes:
    """One item of a decoupled request's stream, for Triton's `response_stats`."""

    kind: str  # "success", "fail" (an error response), "empty" (the final flag alone), "cancel"
    infer_ns: int  # since the previous response (or the execution's start)
    output_ns: int  # checking its outputs against the config


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One step of an ensemble request (pipelines/ensemble.py): its model and latency."""

    number: int  # 1-based, as the ensemble's config lists it
    model: str
    duration_ns: int


@dataclass(slots=True)
class RequestRecord:
    model: str  # "" when the name is not a model of the repository (bounded label values)
    version: str  # the version that served (or was asked for); "" when unresolved
    ctx: CallContext
    duration_ns: int
    request_id: str = ""
    failure: str | None = None  # the reason label; None for a success
    message: str = ""  # the error message of a failure
    rows: int = 0  # rows of this request
    times: ExecutionTimes | None = None  # None when it never reached a batch
    request: InferRequest | None = field(default=None, repr=False)  # decoded, when it was
    # A decoupled model's request: each item of its stream, in order (None otherwise), and
    # the responses the model sent that never reached the client (it had gone).
    responses: list[ResponseTimes] | None = None
    dropped: int = 0
    steps: list[StepTiming] | None = None  # an ensemble's request: its steps, as they ended
    # A model with the response cache: "hit" or "miss" ("" otherwise), and how long the
    # cache took (a hit: lookup and extraction; a miss: lookup and insert), as Triton's.
    cache: str = ""
    cache_ns: int = 0
    # Answered by a degradation tier (docs/reliability.md#degradation-tiers): its number
    # and how ("fallback", "stale", "open_circuit"); 0 and "" otherwise. A request refused
    # by a tier has the tier and "refused".
    degraded_tier: int = 0
    degraded_action: str = ""
    # Refused because the model would not answer within the request's deadline: how long
    # it would have taken (0.0 otherwise); degradation tiers count the request that slow.
    refused_estimate_s: float = 0.0
    # The capture_sample_rate of the version that answered (docs/capture.md): 0, the
    # default, and the answer is not offered to the capture at all.
    capture_rate: float = 0.0
    # Its model has degradation tiers: the sinks that move tiers (Telemetry.watch) see it.
    tiered: bool = False

    @property
    def is_success(self) -> bool:
        return self.failure is None


@dataclass(slots=True)
class BatchRecord:
    model: str
    version: str
    rows: int
    requests: int
    close_reason: str  # BatchClose value: full, preferred_size, max_delay, ...
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    failed: bool
    timed_out: bool = False  # failed by the execution timeout (execution_timeout_ms)
    bisect_executions: int = 0  # it failed and was executed again in parts (isolate.py)
    # Models with pad_inputs: elements of the padded inputs its requests sent, and how many
    # the model received once they were padded to the longest (merge.padding_counts).
    real_elements: int = 0
    padded_elements: int = 0


def note_failure(record: RequestRecord, exc: BaseException) -> None:
    """Fill the record's failure from the exception that ended its request."""
    if isinstance(exc, InferdError):
        record.failure = FAILURE_REASON[exc.kind]
        record.message = exc.message
        if isinstance(exc, DeadlineUnmeetableError):
            record.refused_estimate_s = exc.estimate_s
    elif isinstance(exc, asyncio.CancelledError | GeneratorExit):
        # gRPC cancels the call when the client's deadline passes, racing the server's own
        # deadline timer: past the deadline it is a timeout, whichever came first.
        deadline_ns = record.ctx.deadline_ns
        if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
            record.failure = FAILURE_REASON[ErrorKind.DEADLINE_EXCEEDED]
            record.message = "the request's deadline passed"
        else:
            record.failure = CANCELLED
            record.message = "the client cancelled the request"
    else:
        record.failure = FAILURE_REASON[ErrorKind.INTERNAL]
        record.message = str(exc)


class Sink(Protocol):
    def on_request(self, record: RequestRecord) -> None: ...

    def on_batch(self, record: BatchRecord) -> None: ...


class RequestSink(Protocol):
    def on_request(self, record: RequestRecord) -> None: ...


# (model, version) -> True when what is kept for it goes: a version no longer loaded nor
# draining, or (version "") a model unloaded or gone from the repository
# (ModelRegistry.holds says what stays).
Gone = Callable[[str, str], bool]


class VersionState(Protocol):
    """A part that keeps something per model version or per model (counts, windows, series),
    told by the registry, each time an unload completes, to drop what belongs to versions and
    models that are gone (docs/metrics.md, "Series of unloaded versions")."""

    def forget(self, gone: Gone) -> None: ...


def forget_keys(shared: dict[Any, Any], gone: Gone, per_model: bool = False) -> None:
    """Pop the keys of `shared` that are gone: (model, version, ...) tuples; with `per_model`,
    keys a model alone names (a model name, or a (model, reason) pair). On the event loop; a
    scrape thread reading `shared` meanwhile (telemetry/snapshots.py) skips them."""
    for key in list(shared):
        if per_model:
            model = key if isinstance(key, str) else key[0]
            if gone(model, ""):
                shared.pop(key, None)
        elif gone(key[0], key[1]):
            shared.pop(key, None)


class Telemetry:
    """Fans records out to the sinks; a failing sink is logged, never the request's problem.

    A sink added with `watch` sees only the requests of models with degradation tiers
    (`RequestRecord.tiered`), and no batches: a model without tiers pays it nothing."""

    def __init__(self, sinks: Sequence[Sink] = ()) -> None:
        self.sinks = list(sinks)
        self.tier_sinks: list[RequestSink] = []
        self.keepers: list[VersionState] = []

    def add(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def watch(self, sink: RequestSink) -> None:
        self.tier_sinks.append(sink)

    def keeps(self, part: VersionState) -> None:
        """`part` keeps state per version: `forget` reaches it."""
        self.keepers.append(part)

    def forget(self, gone: Gone) -> None:
        """Every part drops what it keeps for versions and models that are `gone` (the
        registry calls it, on the loop, when an unload completes)."""
        for part in self.keepers:
            try:
                part.forget(gone)
            except Exception:
                log.exception("forgetting unloaded versions failed in %s", type(part).__name__)

    def request(self, record: RequestRecord) -> None:
        for sink in self.sinks:
            try:
                sink.on_request(record)
            except Exception:
                log.exception("telemetry sink %s failed", type(sink).__name__)
        if record.tiered:
            for tier_sink in self.tier_sinks:
                try:
                    tier_sink.on_request(record)
                except Exception:
                    log.exception("telemetry sink %s failed", type(tier_sink).__name__)

    def batch(self, record: BatchRecord) -> None:
        for sink in self.sinks:
            try:
                sink.on_batch(record)
            except Exception:
                log.exception("telemetry sink %s failed", type(sink).__name__)
