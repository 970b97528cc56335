"""The store behind pb_utils.MetricFamily: Triton's rules per kind, and its exposition."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from inferd.backends.python.custom_metrics import CustomMetrics, MetricError
from inferd.backends.python.pb_utils.host import MetricKind
from inferd.metrics.metrics_endpoint import exposition


@pytest.fixture
def store() -> CustomMetrics:
    return CustomMetrics()


def _text(store: CustomMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(store)
    return exposition(registry).decode()


def test_each_kind_takes_its_own_calls(store: CustomMetrics) -> None:
    store.family("requests_seen", "requests", MetricKind.COUNTER)
    store.family("queue_len", "queue", MetricKind.GAUGE)
    store.family("latency_ms", "latency", MetricKind.HISTOGRAM)
    counter = store.new("requests_seen", {"model": "m"}, None)
    gauge = store.new("queue_len", {}, None)
    hist = store.new("latency_ms", {"model": "m"}, [1.0, 5.0])
    store.op(counter, "increment", 2)
    store.op(counter, "increment", 3)
    store.op(gauge, "set", 7)
    store.op(gauge, "increment", -2)
    for value in (0.5, 3.0, 9.0):
        store.op(hist, "observe", value)
    assert store.op(counter, "value", 0) == 5.0 and store.op(gauge, "value", 0) == 5.0
    text = _text(store)
    assert "# TYPE requests_seen counter" in text
    assert 'requests_seen{model="m"} 5.0' in text  # the bare name, as Triton's
    assert "queue_len 5.0" in text
    assert 'latency_ms_bucket{le="1.0",model="m"} 1.0' in text
    assert 'latency_ms_bucket{le="5.0",model="m"} 2.0' in text
    assert 'latency_ms_bucket{le="+Inf",model="m"} 3.0' in text
    assert 'latency_ms_count{model="m"} 3.0' in text and 'latency_ms_sum{model="m"} 12.5' in text


@pytest.mark.parametrize(
    ("kind", "op", "value", "words"),
    [
        (MetricKind.COUNTER, "increment", -1.0, "a counter only goes up"),
        (MetricKind.COUNTER, "set", 1.0, "set() is not supported for a COUNTER"),
        (MetricKind.GAUGE, "observe", 1.0, "observe() is not supported for a GAUGE"),
        (MetricKind.HISTOGRAM, "increment", 1.0, "increment() is not supported for a HISTOGRAM"),
        (MetricKind.HISTOGRAM, "value", 0.0, "value() is not supported for a HISTOGRAM"),
    ],
)
def test_a_call_its_kind_does_not_take_is_refused(
    store: CustomMetrics, kind: MetricKind, op: str, value: float, words: str
) -> None:
    store.family("m", "d", kind)
    handle = store.new("m", {}, [1.0] if kind is MetricKind.HISTOGRAM else None)
    with pytest.raises(MetricError, match=re.escape(words)):
        store.op(handle, op, value)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("inferd_mine", "inferd's and Triton's own"),
        ("nv_inference_mine", "inferd's and Triton's own"),
        ("2fast", "not a valid Prometheus metric name"),
    ],
)
def test_names_that_would_clash_or_break_the_exposition(
    store: CustomMetrics, name: str, words: str
) -> None:
    with pytest.raises(MetricError, match=words):
        store.family(name, "d", MetricKind.GAUGE)


def test_a_family_has_one_kind_and_histograms_need_buckets(store: CustomMetrics) -> None:
    store.family("m", "d", MetricKind.HISTOGRAM)
    store.family("m", "d", MetricKind.HISTOGRAM)  # declared again, the same: fine
    with pytest.raises(MetricError, match="already exists as a HISTOGRAM"):
        store.family("m", "d", MetricKind.GAUGE)
    with pytest.raises(MetricError, match="needs buckets"):
        store.new("m", {}, None)
    with pytest.raises(MetricError, match="needs buckets"):
        store.new("m", {}, [5.0, 1.0])
    with pytest.raises(MetricError, match="no such family"):
        store.new("other", {}, None)
    with pytest.raises(MetricError, match="not a valid Prometheus label name"):
        store.new("m", {"__x": "y"}, [1.0])


def test_a_series_lives_while_an_instance_holds_it(store: CustomMetrics) -> None:
    store.family("shared", "d", MetricKind.COUNTER)
    first = store.new("shared", {"k": "v"}, None)
    second = store.new("shared", {"k": "v"}, None)  # another instance: the same series
    store.op(first, "increment", 1)
    store.op(second, "increment", 1)
    assert store.op(second, "value", 0) == 2.0
    store.release([first])
    assert 'shared{k="v"} 2.0' in _text(store)
    store.release([second])
    assert 'shared{k="v"}' not in _text(store)
    with pytest.raises(MetricError, match="released"):
        store.op(second, "value", 0)
