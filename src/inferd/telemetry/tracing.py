"""W3C trace context and OpenTelemetry spans for inference requests.

Three pieces, each free when unused:

- `parse_traceparent`: the W3C `traceparent` header (version 00), or None; never raises.
- `echo`: the `traceparent` an inference response carries back: the client's trace id and
  flags, and the span id of inferd's server span. "" when the request carried no valid
  traceparent (one string test when it carried none). The span id is derived from the
  request's CallContext, so `TraceSink` gives its server span the very id that was echoed
  without anything being stored per request.
- `TraceSink`: a telemetry sink that turns each RequestRecord into OpenTelemetry spans with
  timestamps reconstructed from the record, exported over OTLP/HTTP by a BatchSpanProcessor
  (a background thread; the event loop only queues finished spans). It needs the `otel`
  extra and is built only when tracing in mode opentelemetry (`--trace-otlp-endpoint`, or
  `--trace-config mode=opentelemetry`).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferd.events import BatchRecord, CallContext, RequestRecord
from inferd.telemetry.trace_config import OTEL_MISSING, otlp
from inferd.telemetry.trace_settings import TraceSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["TraceContext", "TraceSink", "echo", "parse_traceparent", "server_span_id"]

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# Mixed into derived span ids so that two replicas seeing the same traceparent at the same
# perf_counter reading still give their server spans different ids.
_SALT = os.urandom(16)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A parsed W3C traceparent: ids as lowercase hex, as they appear in the header."""

    trace_id: str  # 32 hex digits
    parent_id: str  # 16 hex digits: the caller's span
    flags: str  # 2 hex digits; bit 0 is "sampled"

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 1)

    def header(self, span_id: str | None = None) -> str:
        return f"00-{self.trace_id}-{span_id or self.parent_id}-{self.flags}"


def parse_traceparent(header: object) -> TraceContext | None:
    """The trace context of a W3C `traceparent` value, or None when it is not a valid one.

    Only version 00 is accepted: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`,
    lowercase, with neither id all zeros. Surrounding blanks are tolerated.
    """
    if not isinstance(header, str) or not header:
        return None
    m = _TRACEPARENT.fullmatch(header.strip(" \t"))
    if m is None:
        return None
    trace_id, parent_id, flags = m.groups()
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, parent_id, flags)


def server_span_id(ctx: CallContext) -> str:
    """The span id (16 hex) of inferd's server span for the request `ctx` describes.

    Derived from the request's traceparent and arrival instant: the adapter's echo and the
    TraceSink compute the same id independently.
    """
    h = hashlib.blake2b(digest_size=8, key=_SALT)
    h.update(ctx.traceparent.encode("ascii", "replace"))
    h.update(ctx.start_ns.to_bytes(8, "little", signed=True))
    span_id = h.hexdigest()
    return span_id if span_id != _ZERO_SPAN else "0" * 15 + "1"


def echo(ctx: CallContext) -> str:
    """The `traceparent` to send back with the response to `ctx`'s request, or ""."""
    if not ctx.traceparent or ctx.trace_root:
        return ""
    return span_header(ctx)


def span_header(ctx: CallContext) -> str:
    """A `traceparent` naming the server span of `ctx`'s request as the parent (for calls
    it makes: an ensemble's steps), or "" when it has no valid traceparent."""
    parsed = parse_traceparent(ctx.traceparent) if ctx.traceparent else None
    if parsed is None:
        return ""
    return parsed.header(server_span_id(ctx))


def start_trace(ctx: CallContext) -> None:
    """Give a request that carried no traceparent one of the server's own (`trace_root`), so
    that the calls it makes can name its span as their parent."""
    if not ctx.traceparent:
        ctx.traceparent = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
        ctx.trace_root = True


# -- OpenTelemetry export ---------------------------------------------------------------------


class TraceSink:
    """Emits one span tree per request to an OTLP/HTTP traces endpoint.

    inferd.infer <model>          SERVER span, the whole request (parent: the client's span)
      queue                       waiting in the model's queue
      execute                     the backend's execute of the batch (inferd.batch_size)
      respond                     splitting and checking the outputs

    Children are laid end to end backwards from the end of the request, from the durations
    in the record: decoding and scheduling wake-ups are the small gaps between them.
    Which requests are traced is first `settings`' choice (trace level, rate and count, set
    through the trace settings API; by default every request). Of those, sampling follows
    the client's sampled flag (ParentBased); requests without a traceparent start a trace
    of their own. The standard OTEL_TRACES_SAMPLER variables override that.
    """

    def __init__(
        self, endpoint: str, service_name: str = "inferd", settings: TraceSettings | None = None
    ) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        except ImportError as exc:
            raise RuntimeError(OTEL_MISSING) from exc

        class _IdGenerator(RandomIdGenerator):
            """Random ids, except the server span's, which must be the echoed one."""

            def __init__(self) -> None:
                self.next_span_id = threading.local()
                self.next_trace_id = threading.local()

            def generate_trace_id(self) -> int:
                forced: int | None = getattr(self.next_trace_id, "value", None)
                if forced is not None:
                    self.next_trace_id.value = None
                    return forced
                return int(super().generate_trace_id())

            def generate_span_id(self) -> int:
                forced: int | None = getattr(self.next_span_id, "value", None)
                if forced is not None:
                    self.next_span_id.value = None
                    return forced
                return int(super().generate_span_id())

        self.endpoint = endpoint
        self.settings = settings if settings is not None else TraceSettings(otlp(endpoint))
        self._trace = trace
        self._ids = _IdGenerator()
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": service_name}), id_generator=self._ids
        )
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("inferd")
        self._server_kind = trace.SpanKind.SERVER
        self._is_shut_down = False

    def _parent(self, parsed: TraceContext | None) -> Any:
        """The OpenTelemetry context holding the client's span, or None for a new trace."""
        if parsed is None:
            return None
        trace = self._trace
        remote = trace.SpanContext(
            trace_id=int(parsed.trace_id, 16),
            span_id=int(parsed.parent_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(int(parsed.flags, 16)),
        )
        return trace.set_span_in_context(trace.NonRecordingSpan(remote))

    def on_request(self, record: RequestRecord) -> None:
        if self._is_shut_down:
            return
        chosen = self.settings.admit(record.model)
        if chosen is None:
            return
        ctx = record.ctx
        start = int(ctx.wall_start_s * 1e9)
        end = start + max(record.duration_ns, 0)
        attributes: dict[str, str | int] = {
            "inferd.model": record.model,
            "inferd.version": record.version,
            "inferd.request_id": record.request_id,
            "inferd.status": "success" if record.failure is None else "failure",
            "inferd.protocol": ctx.protocol,
            "inferd.rows": record.rows,
        }
        if record.failure is not None:
            attributes["inferd.reason"] = record.failure
        if ctx.client:
            attributes["client.address"] = ctx.client
        name = f"inferd.infer {record.model}" if record.model else "inferd.infer"
        parsed = parse_traceparent(ctx.traceparent) if ctx.traceparent else None
        if parsed is not None:
            self._ids.next_span_id.value = int(server_span_id(ctx), 16)
            if ctx.trace_root:  # the server's own trace id, the span its root
                self._ids.next_trace_id.value = int(parsed.trace_id, 16)
        try:
            span = self.tracer.start_span(
                name,
                context=None if ctx.trace_root else self._parent(parsed),
                kind=self._server_kind,
                attributes=attributes,
                start_time=start,
            )
        finally:
            self._ids.next_span_id.value = None
            self._ids.next_trace_id.value = None
        if span.is_recording():  # not unsampled by the caller's traceparent
            self.settings.spend(chosen)
        if record.failure is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, record.message))
        times = record.times
        if times is not None and span.is_recording():
            inside = self._trace.set_span_in_context(span)
            respond_start = max(end - times.compute_output_ns, start)
            execute_start = max(respond_start - times.compute_infer_ns, start)
            queue_end = max(execute_start - times.compute_input_ns, start)
            queue_start = max(queue_end - times.queue_ns, start)
            self._child("queue", inside, queue_start, queue_end, None)
            self._child(
                "execute",
                inside,
                execute_start,
                respond_start,
                {
                    "inferd.batch_size": times.batch_rows,
                    "inferd.batch_requests": times.batch_requests,
                },
            )
            self._child("respond", inside, respond_start, end, None)
        span.end(end_time=end)

    def _child(
        self, name: str, parent: Any, start: int, end: int, attributes: dict[str, int] | None
    ) -> None:
        child = self.tracer.start_span(
            name, context=parent, attributes=attributes, start_time=start
        )
        child.end(end_time=end)

    def on_batch(self, record: BatchRecord) -> None:
        pass

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export every finished span now; blocks up to `timeout_s`."""
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued (up to `timeout_s`) and stop the exporter. Blocking: call it
        off the event loop (asyncio.to_thread) at server shutdown."""
        if self._is_shut_down:
            return
        self._is_shut_down = True
        self.force_flush(timeout_s)
        self.provider.shutdown()
