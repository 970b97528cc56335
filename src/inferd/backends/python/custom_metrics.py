"""Metrics that Python models define (Triton's custom metrics API, `pb_utils.MetricFamily`).

One store per server, exported on its /metrics endpoint beside inferd's own metrics, with the
names, kinds and labels the model gave (counters without a `_total` suffix, as Triton's).
Models reach it through their `ModelHost`; every call may come from a model's thread, and
scrapes come from the metrics server's threads, so each touches the store under its lock
(short sections, never across an await or a model call).

A series lives while a model instance holds it: instances that ask for the same family and
labels share one series, and it is dropped when the last of them unloads.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from inferd.backends.python.pb_utils.host import MetricKind

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# inferd's own metrics, and Triton's that `--metrics-triton-names` exports.
RESERVED_PREFIXES = ("inferd_", "nv_")
_PROMETHEUS_TYPE = {
    MetricKind.COUNTER: "counter",
    MetricKind.GAUGE: "gauge",
    MetricKind.HISTOGRAM: "histogram",
}


class MetricError(ValueError):
    """A custom metric call that cannot be honoured; the message names metric and call."""


@dataclass(slots=True)
class _Series:
    family: _Family
    labels: tuple[tuple[str, str], ...]
    users: int = 0
    value: float = 0.0  # a counter's or gauge's value; a histogram's sum
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, ascending
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf


@dataclass(slots=True)
class _Family:
    name: str
    description: str
    kind: MetricKind
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)


class CustomMetrics(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._handles: dict[int, _Series] = {}
        self._ids = itertools.count(1)

    def family(self, name: str, description: str, kind: MetricKind) -> None:
        """Declare a family; declaring it again with the same description and kind is fine."""
        where = f"MetricFamily '{name}'"
        if not _NAME.fullmatch(name):
            raise MetricError(f"{where}: not a valid Prometheus metric name")
        if name.startswith(RESERVED_PREFIXES):
            raise MetricError(
                f"{where}: names starting with {' or '.join(RESERVED_PREFIXES)} are inferd's "
                "and Triton's own metrics"
            )
        with self._lock:
            known = self._families.get(name)
            if known is None:
                self._families[name] = _Family(name, description, kind)
            elif (known.kind, known.description) != (kind, description):
                raise MetricError(
                    f"{where} already exists as a {known.kind.name} described "
                    f"'{known.description}'; a family is declared once, with one kind"
                )

    def new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> int:
        """A handle to the family's series with `labels` (made on first use)."""
        where = f"MetricFamily '{family}'.Metric"
        for label in labels:
            if not _LABEL.fullmatch(label) or label.startswith("__"):
                raise MetricError(f"{where}: label '{label}' is not a valid Prometheus label name")
        key = tuple(sorted(labels.items()))
        with self._lock:
            fam = self._families.get(family)
            if fam is None:
                raise MetricError(f"{where}: no such family (create the MetricFamily first)")
            if fam.kind is MetricKind.HISTOGRAM:
                if not buckets or list(buckets) != sorted(set(buckets)):
                    raise MetricError(
                        f"{where}: a HISTOGRAM series needs buckets: upper bounds, ascending"
                    )
            elif buckets is not None:
                raise MetricError(f"{where}: buckets are for HISTOGRAM families only")
            series = fam.series.get(key)
            if series is None:
                bounds = tuple(buckets or ())
                series = _Series(fam, key, buckets=bounds, counts=[0] * (len(bounds) + 1))
                fam.series[key] = series
            elif buckets is not None and tuple(buckets) != series.buckets:
                raise MetricError(
                    f"{where}: this series exists with buckets {list(series.buckets)}"
                )
            series.users += 1
            handle = next(self._ids)
            self._handles[handle] = series
            return handle

    def op(self, handle: int, op: str, value: float) -> float | None:
        """`increment`, `set`, `observe` or `value` on the series behind `handle`."""
        with self._lock:
            series = self._handles.get(handle)
            if series is None:
                raise MetricError("this Metric was released (its model instance unloaded)")
            kind = series.family.kind
            where = f"Metric of {kind.name} '{series.family.name}'"
            if op == "value":
                if kind is MetricKind.HISTOGRAM:
                    raise MetricError(f"{where}: value() is not supported for a HISTOGRAM")
                return series.value
            if op == "increment" and kind is not MetricKind.HISTOGRAM:
                if kind is MetricKind.COUNTER and value < 0:
                    raise MetricError(f"{where}: a counter only goes up, got increment({value})")
                series.value += value
            elif op == "set" and kind is MetricKind.GAUGE:
                series.value = value
            elif op == "observe" and kind is MetricKind.HISTOGRAM:
                series.counts[bisect.bisect_left(series.buckets, value)] += 1
                series.value += value
            else:
                raise MetricError(f"{where}: {op}() is not supported for a {kind.name}")
            return None

    def release(self, handles: Iterable[int]) -> None:
        """The instance that made these handles unloaded: drop series nobody uses."""
        with self._lock:
            for handle in handles:
                series = self._handles.pop(handle, None)
                if series is None:
                    continue
                series.users -= 1
                if series.users <= 0:
                    series.family.series.pop(series.labels, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = [
                (f.name, f.description, f.kind, [_snapshot(s) for s in f.series.values()])
                for f in self._families.values()
            ]
        for name, description, kind, rows in families:
            family = Metric(name, description, _PROMETHEUS_TYPE[kind])
            for labels, value, buckets, counts in rows:
                if kind is not MetricKind.HISTOGRAM:
                    family.add_sample(name, labels, value)  # the bare name, as Triton's
                    continue
                bounds = [*map(str, buckets), "+Inf"]
                for bound, total in zip(bounds, itertools.accumulate(counts), strict=True):
                    family.add_sample(f"{name}_bucket", {**labels, "le": bound}, float(total))
                family.add_sample(f"{name}_count", labels, float(sum(counts)))
                family.add_sample(f"{name}_sum", labels, value)
            yield family


def _snapshot(series: _Series) -> tuple[dict[str, str], float, tuple[float, ...], list[int]]:
    return dict(series.labels), series.value, series.buckets, list(series.counts)
