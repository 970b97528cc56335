"""Triton's custom metrics API: `MetricFamily(name, description, kind).Metric(labels)`.

The metrics live in the server (inferd.backends.python.custom_metrics) and are exported on its
/metrics endpoint beside inferd's own; a model only holds handles to them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inferd.backends.python.pb_utils.host import MetricKind, ModelHost, current_host
from inferd.backends.python.pb_utils.triton_errors import TritonModelException


class Metric:
    """One labelled series of a family; made by `MetricFamily.Metric`."""

    def __init__(self, host: ModelHost, handle: int) -> None:
        self._host = host
        self._handle = handle

    def increment(self, value: float) -> None:
        """Add `value` (a counter: >= 0; a gauge: any sign)."""
        self._host.metric_op(self._handle, "increment", float(value))

    def set(self, value: float) -> None:
        """Set a gauge to `value`."""
        self._host.metric_op(self._handle, "set", float(value))

    def observe(self, value: float) -> None:
        """Record one observation of a histogram."""
        self._host.metric_op(self._handle, "observe", float(value))

    def value(self) -> float:
        """The current value of a counter or gauge."""
        result = self._host.metric_op(self._handle, "value", 0.0)
        return float(result or 0.0)


class MetricFamily:
    """A named metric of one kind; its series are made with `.Metric(labels=...)`."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(kind, MetricKind):
            raise TritonModelException(
                f"MetricFamily '{name}': kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            )
        self._host = current_host("pb_utils.MetricFamily")
        self._host.metric_family(str(name), str(description), kind)
        self._name = str(name)
        self._kind = kind

    def Metric(  # noqa: N802 (Triton's name)
        self,
        labels: Mapping[str, str] | None = None,
        buckets: Sequence[float] | None = None,
    ) -> Metric:
        """A series of this family with `labels` (histograms need their `buckets`)."""
        handle = self._host.metric_new(
            self._name,
            {str(k): str(v) for k, v in (labels or {}).items()},
            None if buckets is None else [float(b) for b in buckets],
        )
        return Metric(self._host, handle)
