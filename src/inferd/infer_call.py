"""One unary request from `DataPlane.start` to its answer (inference.py): what it was sent
to, its telemetry record, and its place among the requests in flight."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Protocol

from inferd.events import CallContext, RequestRecord, Telemetry, note_failure


class _Counts(Protocol):
    """What a call uses of the DataPlane: the count of requests in flight, and telemetry."""

    _inflight: int
    telemetry: Telemetry


class InferCall:
    """A context manager: in flight within its `with`; at its end, failure or not, the
    request's record goes to telemetry."""

    __slots__ = ("_owner", "ctx", "model_name", "record", "version")

    def __init__(self, owner: _Counts, model_name: str, version: str, ctx: CallContext) -> None:
        self._owner = owner
        self.model_name = model_name
        self.version = version
        self.ctx = ctx
        # Labels stay "" until resolved: a name or version no model has must not become a
        # label value (clients could otherwise grow the metrics without bound).
        self.record = RequestRecord(model="", version="", ctx=ctx, duration_ns=0)

    def __enter__(self) -> InferCall:
        self._owner._inflight += 1
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._owner._inflight -= 1
        if exc is not None:
            note_failure(self.record, exc)
        self.record.duration_ns = time.perf_counter_ns() - self.ctx.start_ns
        self._owner.telemetry.request(self.record)
