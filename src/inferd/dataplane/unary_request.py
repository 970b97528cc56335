"""One unary request from `DataPlane.start` to its answer (unary.py): what it was sent
to, its telemetry record, and its place among the requests in flight."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self

from inferd.dataplane.request_gate import RequestGate
from inferd.events import CallContext, RequestRecord, note_failure


class InferCall:
    """A context manager: in flight (counted by the DataPlane's `RequestGate`) within its
    `with`; at its end, failure or not, the request's record goes to telemetry."""

    __slots__ = ("_gate", "ctx", "model_name", "record", "version")

    def __init__(self, gate: RequestGate, model_name: str, version: str, ctx: CallContext) -> None:
        self._gate = gate
        self.model_name = model_name
        self.version = version
        self.ctx = ctx
        # Labels stay "" until resolved: a name or version no model has must not become a
        # label value (clients could otherwise grow the metrics without bound).
        self.record = RequestRecord(model="", version="", ctx=ctx, duration_ns=0)

    def __enter__(self) -> Self:
        self._gate.inflight += 1
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._gate.inflight -= 1
        if exc is not None:
            note_failure(self.record, exc)
        self.record.duration_ns = time.perf_counter_ns() - self.ctx.start_ns
        self._gate.telemetry.request(self.record)


class StreamCall(InferCall):
    """A streaming request (decoupled.py): as an `InferCall` for a model that is not
    decoupled; for a decoupled one its record is handed to the stream, which tells it once
    the stream ends, so the request counts once, failures included."""

    __slots__ = ("_handed", "decoupled", "fallback_from")

    def __init__(
        self,
        gate: RequestGate,
        model_name: str,
        version: str,
        ctx: CallContext,
        fallback_from: str = "",
    ) -> None:
        super().__init__(gate, model_name, version, ctx)
        self.fallback_from = fallback_from  # the model whose open circuit sent it here
        self.decoupled = False  # set by `admit_stream`
        self._handed = False  # the record is no longer this call's to tell

    def hand_over(self) -> None:
        """The decoupled stream has the record: it calls `told` when the stream ends."""
        self._handed = True

    def drop(self) -> None:
        """Counted as its fallback model's request instead: out of flight, never told."""
        self._gate.inflight -= 1
        self._handed = True

    def told(self) -> None:
        """The stream has ended and filled the record in: out of flight, to telemetry."""
        self._gate.inflight -= 1
        self._gate.telemetry.request(self.record)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._handed:
            super().__exit__(kind, exc, tb)
