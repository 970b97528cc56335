"""A traced ensemble request: one span per step, each under the ensemble's span (the
client's traceparent's child, or the root of a trace of the server's when it sent none)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.telemetry.tracing import TraceSink  # noqa: I001 (after the optional-dependency skip above)
from tests.support.async_infer import PROTOCOLS
from tests.support.ensemble_models import write_ensemble_models
from tests.support.servers import RunningServer, run_server
from tests.support.trace_collector import PARENT_ID, Collector, added, attrs

BODY = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [2.0]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("ensemble_tracing")
    write_ensemble_models(root)
    with run_server(root / "models") as running:
        yield running


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def _send(protocol: str, server: RunningServer, traceparent: str = "") -> str:
    """The traceparent the response echoed ("": none)."""
    headers = {"traceparent": traceparent} if traceparent else {}
    if protocol == "http":
        with server.client() as c:
            r = c.post("/v2/models/chain/infer", json=BODY, headers=headers)
            assert r.status_code == 200
            return r.headers.get("traceparent", "")
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        inp = grpcclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), 2.0, np.float32))
        client.infer("chain", [inp], headers=headers)
        return ""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_step_has_a_span_under_the_ensembles(
    server: RunningServer, collector: Collector, protocol: str
) -> None:
    trace_id = ("a1" if protocol == "http" else "b2") * 16
    sink = TraceSink(collector.endpoint)
    try:
        with added(server, sink):
            _send(protocol, server, f"00-{trace_id}-{PARENT_ID}-01")
            assert sink.force_flush()
    finally:
        sink.shutdown()
    _check_tree(collector.spans(), trace_id, PARENT_ID)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_a_traceparent_the_ensembles_span_is_the_root(
    server: RunningServer, collector: Collector, protocol: str
) -> None:
    sink = TraceSink(collector.endpoint)
    try:
        with added(server, sink):
            assert _send(protocol, server) == ""  # nothing echoed: the client sent none
            assert sink.force_flush()
    finally:
        sink.shutdown()
    [ensemble] = [s for s in collector.spans() if s.name == "inferd.infer chain"]
    assert not ensemble.parent_span_id
    _check_tree(collector.spans(), ensemble.trace_id.hex(), "")


def _check_tree(spans: list[Any], trace_id: str, parent_id: str) -> None:
    spans = [s for s in spans if s.trace_id.hex() == trace_id]
    servers: dict[str, Any] = {s.name: s for s in spans if s.name.startswith("inferd.infer")}
    assert set(servers) == {
        "inferd.infer chain",
        "inferd.infer double",
        "inferd.infer add_ten",
        "inferd.infer square",
    }
    ensemble = servers["inferd.infer chain"]
    assert ensemble.parent_span_id.hex() == parent_id
    for name in ("double", "add_ten", "square"):
        step = servers[f"inferd.infer {name}"]
        assert step.parent_span_id == ensemble.span_id, f"{name}'s span is not under the ensemble's"
        assert attrs(step)["inferd.model"] == name
        assert ensemble.start_time_unix_nano <= step.start_time_unix_nano
        assert step.end_time_unix_nano <= ensemble.end_time_unix_nano
