"""The request log: one structured line per failed request and per sampled success.

A telemetry sink. Failures are always logged (WARNING for the client's or the load's
doing, ERROR for the model's or inferd's, INFO for a client that went away, once, under
the model it called); successes with probability `sample_rate`, at INFO. So are shed
requests (429): under overload they come by the thousand per second, every one is counted
in the metrics, and a log line each would make the overload worse. A line that is not
sampled costs one random draw: everything else (the trace id, the input fingerprint) is
computed only for lines actually written.
"""

from __future__ import annotations

import hashlib
import logging
from random import random
from typing import Any

import numpy as np

from inferd.events import CANCELLED, BatchRecord, RequestRecord
from inferd.telemetry.tracing import parse_traceparent, server_span_id
from inferd.types import Tensor

# Failures that are the model's or inferd's fault; every other reason logs as a warning.
_ERROR_REASONS = frozenset({"model_error", "internal"})
# Failures sampled like successes: load shedding (see the module docstring).
_SAMPLED_REASONS = frozenset({"rejected"})


class RequestLogSink:
    def __init__(self, sample_rate: float, logger_name: str = "inferd.requests") -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"log sample rate {sample_rate} is not between 0 and 1")
        self.sample_rate = sample_rate
        self.logger = logging.getLogger(logger_name)

    def on_request(self, record: RequestRecord) -> None:
        failure = record.failure
        if failure is None or failure in _SAMPLED_REASONS:
            if random() >= self.sample_rate:  # rate 0: never; rate 1: always (random() < 1)
                return
            level = logging.INFO if failure is None else logging.WARNING
        elif failure == CANCELLED:
            # The client went away: not a fault of anyone's to warn about. A step of an
            # ensemble is not logged: the ensemble's own line names the model the client
            # called and the step it was in.
            if record.ctx.caller is not None:
                return
            level = logging.INFO
        else:
            level = logging.ERROR if failure in _ERROR_REASONS else logging.WARNING
        logger = self.logger
        if not logger.isEnabledFor(level):
            return
        fields = request_fields(record)
        what = f"{fields['protocol']} infer {fields['model'] or '?'} v{fields['version'] or '?'}"
        if failure is None:
            message = f"{what}: success"
        else:
            message = f"{what} failed ({failure}): {record.message}"
        if record.steps:
            if failure is not None:
                last = record.steps[-1]  # where it ended: appended as each step ends
                message += f" (in step {last.number}, {last.model})"
            message += "; steps " + ", ".join(
                f"{s.number} ({s.model}) {s.duration_ns / 1e6:.3f} ms" for s in record.steps
            )
        line = logger.makeRecord(logger.name, level, __file__, 0, message, (), None, extra=fields)
        # The line's timestamp is the request's arrival.
        if record.ctx.wall_start_s:
            line.created = record.ctx.wall_start_s
            line.msecs = (line.created - int(line.created)) * 1000
        logger.handle(line)

    def on_batch(self, record: BatchRecord) -> None:
        pass


def request_fields(record: RequestRecord) -> dict[str, Any]:
    """The structured fields of a request's log line (see docs/observability-logs-traces.md)."""
    ctx = record.ctx
    request = record.request
    trace = parse_traceparent(ctx.traceparent) if ctx.traceparent else None
    times = record.times
    inputs = request.inputs if request is not None else []
    fields: dict[str, Any] = {
        "request_id": record.request_id,
        "trace_id": trace.trace_id if trace is not None else "",
        "span_id": server_span_id(ctx) if trace is not None else "",
        # A model the repository does not have is logged under the name the client asked for.
        "model": record.model or (request.model_name if request is not None else ""),
        "version": record.version,
        "status": "success" if record.failure is None else "failure",
        "reason": record.failure,
        "error": record.message,
        "latency_ms": round(record.duration_ns / 1e6, 3),
        "queue_ms": round(times.queue_ns / 1e6, 3) if times is not None else None,
        "batch_size": times.batch_rows if times is not None else None,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in inputs
        ],
        "input_fingerprint": input_fingerprint(inputs) if inputs else "",
        "client": ctx.client,
        "protocol": ctx.protocol,
    }
    if record.degraded_tier:  # answered (or refused) by a degradation tier
        fields["degradation_tier"] = record.degraded_tier
        fields["degradation_action"] = record.degraded_action
    if record.steps is not None:  # an ensemble's request: each step's model and latency
        fields["steps"] = [
            {"step": s.number, "model": s.model, "latency_ms": round(s.duration_ns / 1e6, 3)}
            for s in record.steps
        ]
    return fields


def input_fingerprint(inputs: list[Tensor]) -> str:
    """A 64-bit BLAKE2b of the inputs' names, datatypes, shapes and data, in hex.

    Equal requests (same tensors, in the same order) have equal fingerprints, so repeats of
    a failing input can be found in the log without logging the data itself.
    """
    h = hashlib.blake2b(digest_size=8)
    for t in inputs:
        h.update(f"{t.name}\0{t.datatype}\0{','.join(map(str, t.shape))}\0".encode())
        data = t.data
        if t.datatype == "BYTES" or data.dtype.kind in "OSU":
            for element in data.flat:
                if isinstance(element, bytes | bytearray | memoryview):
                    raw = bytes(element)
                elif isinstance(element, str):
                    raw = element.encode("utf-8")
                else:
                    raw = str(element).encode("utf-8")
                h.update(len(raw).to_bytes(8, "little"))
                h.update(raw)
        else:
            # As bytes: the buffer protocol cannot describe bfloat16 (BF16) elements.
            h.update(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
    return h.hexdigest()
