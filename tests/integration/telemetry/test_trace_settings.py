"""The trace settings API (Triton's trace extension) over HTTP and gRPC with tritonclient's
`update_trace_settings` / `get_trace_settings`, checked against the spans that actually
reach an OTLP collector (trace mode opentelemetry; test_trace_file.py has mode triton)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from inferd.telemetry.trace_config import otlp
from tests.support.models import write_counter
from tests.support.servers import RunningServer, run_server
from tests.support.trace_clients import TraceClient

pytest.importorskip("opentelemetry.sdk.trace", reason="tracing tests need inferd[otel]")
from tests.support.trace_collector import Collector  # noqa: E402

PROTOCOLS = ["http", "grpc"]
DEFAULTS = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": "1",
    "trace_count": "-1",
    "trace_mode": "opentelemetry",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace_settings_repo")
    write_counter(path, "counter")
    write_counter(path, "other")
    return path


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def server(repo: Path, collector: Collector) -> Iterator[RunningServer]:
    with run_server(repo, admin_api=True, trace=otlp(collector.endpoint)) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(
    request: pytest.FixtureRequest, server: RunningServer, collector: Collector
) -> Iterator[TraceClient]:
    c = TraceClient(request.param, server)
    yield c
    # Back to the defaults through the API itself: null drops values (tritonclient sends
    # JSON null over HTTP, a setting without values over gRPC).
    cleared = {"trace_level": None, "trace_rate": None, "trace_count": None}
    for model in ("counter", "other"):
        c.update(cleared, model)
    assert c.update(cleared) == DEFAULTS
    c.close()


def traced(server: RunningServer, collector: Collector) -> dict[str, int]:
    """Server spans exported since the last call, by model; clears the collector."""
    assert server.server.trace_sink is not None and server.server.trace_sink.force_flush()
    counts: dict[str, int] = {}
    for span in collector.spans():
        if span.name.startswith("inferd.infer"):
            model = span.name.removeprefix("inferd.infer ")
            counts[model] = counts.get(model, 0) + 1
    collector.requests.clear()
    return counts


def test_defaults_trace_every_request(
    client: TraceClient, server: RunningServer, collector: Collector
) -> None:
    traced(server, collector)
    assert client.get() == DEFAULTS
    assert client.get("counter") == DEFAULTS
    client.infer("counter", 3)
    assert traced(server, collector) == {"counter": 3}


def test_trace_rate_traces_one_request_in_n(
    client: TraceClient, server: RunningServer, collector: Collector
) -> None:
    traced(server, collector)
    assert client.update({"trace_rate": "3"})["trace_rate"] == "3"
    client.infer("counter", 4)  # the 1st and the 4th
    client.infer("other", 2)  # one global counter: the 5th and 6th are not traced
    assert traced(server, collector) == {"counter": 2}
    client.update({"trace_rate": "1"})
    client.infer("other", 2)
    assert traced(server, collector) == {"other": 2}


def test_trace_count_stops_after_that_many_traces(
    client: TraceClient, server: RunningServer, collector: Collector
) -> None:
    traced(server, collector)
    client.update({"trace_count": "2"})
    client.infer("counter", 5)
    assert traced(server, collector) == {"counter": 2}
    assert client.get()["trace_count"] == "0"  # what is left


def test_a_model_override_and_its_removal(
    client: TraceClient, server: RunningServer, collector: Collector
) -> None:
    traced(server, collector)
    answer = client.update({"trace_level": ["OFF"]}, "counter")
    assert answer == {**DEFAULTS, "trace_level": ["OFF"]}
    assert client.get() == DEFAULTS  # the global settings are untouched
    client.infer("counter", 2)
    client.infer("other", 2)
    assert traced(server, collector) == {"other": 2}
    # The override's own rate counts the model's requests alone.
    client.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "2"}, "counter")
    client.infer("counter", 4)
    client.infer("other", 1)
    assert traced(server, collector) == {"counter": 2, "other": 1}
    assert client.update({"trace_level": None, "trace_rate": None}, "counter") == DEFAULTS
    client.infer("counter", 2)
    assert traced(server, collector) == {"counter": 2}


# (id, settings, words in the message)
REFUSED = [
    ("trace_file", {"trace_file": "/tmp/trace.json"}, ["'trace_file'", "set at start only"]),
    ("log_frequency", {"log_frequency": "10"}, ["'log_frequency'", "mode opentelemetry"]),
    ("TENSORS", {"trace_level": ["TENSORS"]}, ["'trace_level'", "TENSORS is not supported"]),
    ("unknown level", {"trace_level": ["ALL"]}, ["'trace_level'", "'ALL'"]),
    ("OFF with another", {"trace_level": ["OFF", "TIMESTAMPS"]}, ["OFF must be the only"]),
    ("rate 0", {"trace_rate": "0"}, ["'trace_rate'", "from 1"]),
    ("rate not a number", {"trace_rate": "often"}, ["'trace_rate'", "'often'"]),
    ("count below -1", {"trace_count": "-2"}, ["'trace_count'", "from -1"]),
    ("other mode", {"trace_mode": "triton"}, ["'trace_mode'", "chosen at start", "'triton'"]),
    ("unknown setting", {"trace_colour": "blue"}, ["unknown trace setting 'trace_colour'"]),
    # All or nothing: the valid rate beside a refused setting is not applied either.
    ("a valid one beside", {"trace_rate": "5", "trace_file": "x"}, ["'trace_file'"]),
]


@pytest.mark.parametrize(
    ("settings", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_settings_inferd_cannot_honour_are_refused(
    client: TraceClient, settings: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.update(settings)
    expected = "400" if client.protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert info.value.status() == expected
    for word in words:
        assert word in info.value.message()
    assert client.get() == DEFAULTS


def test_an_unknown_model_is_not_found(client: TraceClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get("nope")
    expected = "404" if client.protocol == "http" else "StatusCode.NOT_FOUND"
    assert info.value.status() == expected
    assert "unknown model 'nope'" in info.value.message()


@pytest.fixture(scope="module")
def plain_server(repo: Path) -> Iterator[RunningServer]:
    """No --admin-api, no tracing."""
    with run_server(repo) as running:
        yield running


@pytest.fixture(scope="module")
def untraced_server(repo: Path) -> Iterator[RunningServer]:
    """--admin-api on, no tracing."""
    with run_server(repo, admin_api=True) as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_changes_need_the_admin_api_reading_does_not(
    plain_server: RunningServer, protocol: str
) -> None:
    c = TraceClient(protocol, plain_server)
    try:
        assert c.get()["trace_level"] == ["OFF"]  # nothing is traced without a file or collector
        with pytest.raises(InferenceServerException) as info:
            c.update({"trace_rate": "2"})
    finally:
        c.close()
    expected = "403" if protocol == "http" else "StatusCode.PERMISSION_DENIED"
    assert info.value.status() == expected
    assert "--admin-api on" in info.value.message()


# Triton's defaults, with nowhere to trace to.
UNTRACED = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_a_file_or_a_collector_changes_are_refused(
    untraced_server: RunningServer, protocol: str
) -> None:
    c = TraceClient(protocol, untraced_server)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.update({"trace_level": ["TIMESTAMPS"]})
        assert c.get() == UNTRACED
    finally:
        c.close()
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert info.value.status() == expected
    assert "tracing is off" in info.value.message()
    assert "--trace-config triton,file=PATH" in info.value.message()
    assert "--trace-otlp-endpoint" in info.value.message()


def test_server_metadata_lists_trace_and_logging(plain_server: RunningServer) -> None:
    with plain_server.client() as c:
        extensions = c.get("/v2").json()["extensions"]
    assert {"trace", "logging"} <= set(extensions)
