"""Features a model does not use cost it nothing: with no response cache, no drift
reference, no capture, no degradation tiers, no tracing and no sequence batching, a request
to that model calls none of those features' code, over HTTP and gRPC; and the same count
sees each feature's code on a model that uses it (so the first test could fail).

inferd's own Python calls are counted (tests/support/call_counter.py), in every thread of
a real server, per request, after a warm-up.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import numpy as np
import pytest

from inferd.cache.cache_settings import parse_cache_config
from tests.support.call_counter import (
    CallCounter,
    calls_per_request,
    grpc_request,
    profiled_threads,
)
from tests.support.degrade_models import degrade
from tests.support.drift_models import FEATURES, write_drift_model
from tests.support.servers import RunningServer, run_server

REQUESTS = 20

# Each feature: the model that uses it, and where its per-request work is (paths under
# src/inferd, as the counter names functions).
USES = {
    "response cache": ("cached", ("cache/", "dataplane/cache_step.py")),
    "drift monitoring": ("drifting", ("monitoring/drift",)),
    "capture": ("captured", ("dataplane/capture.py", "monitoring/capture", "monitoring/feedback")),
    "degradation tiers": ("tiered", ("reliability/degrade/", "repository/degrade_guard.py")),
    # A request carrying a traceparent (the trace file's sink exists only with a file).
    "tracing": ("plain", ("telemetry/tracing.py", "telemetry/trace_file.py")),
    "sequence batching": ("sequenced", ("scheduling/sequence/",)),
}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def counted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[CallCounter, RunningServer]]:
    repo = tmp_path_factory.mktemp("features_off")
    write_drift_model(repo, "drifting", {"drift_cpu_budget": "1"})
    for name, parameters in (("plain", {}), ("captured", {"capture_sample_rate": "1"}),
                             ("cached", {}), ("tiered", {}), ("sequenced", {})):  # fmt: skip
        write_drift_model(repo, name, parameters)
        (repo / name / "1" / "reference.npz").unlink()
    config = {name: repo / name / "config.pbtxt" for name in ("cached", "tiered", "sequenced")}
    config["cached"].write_text(config["cached"].read_text() + "response_cache { enable: true }\n")
    config["tiered"].write_text(config["tiered"].read_text() + degrade("60000: queue=64") + "\n")
    text = config["sequenced"].read_text().replace("dynamic_batching { }", "")
    config["sequenced"].write_text(text + "sequence_batching { direct { } }\n")
    counter = CallCounter()
    cache = parse_cache_config(["local,size=1M"])
    with profiled_threads(counter), run_server(repo, cache=cache) as server:
        yield counter, server


def _rows() -> np.ndarray:
    return np.random.default_rng(0).random((1, FEATURES), dtype=np.float32)


Wire = Callable[[RunningServer, str, ExitStack], Callable[[], object]]


def _http(
    server: RunningServer, model: str, stack: ExitStack, headers: dict[str, str] | None = None
) -> Callable[[], object]:
    client = stack.enter_context(httpx.Client(base_url=server.url, timeout=30))
    data = _rows().ravel().tolist()
    ids = itertools.count(1)

    def request() -> object:
        tensor = {"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": data}
        body: dict[str, Any] = {"inputs": [tensor]}
        if model == "sequenced":  # a sequence of one request each time
            body["parameters"] = {"sequence_id": next(ids), "sequence_start": True,
                                  "sequence_end": True}  # fmt: skip
        r = client.post(f"/v2/models/{model}/infer", json=body, headers=headers or {})
        assert r.status_code == 200, r.text
        return r

    return request


def _grpc(server: RunningServer, model: str, stack: ExitStack) -> Callable[[], object]:
    return grpc_request(server.grpc_address, model, "input", _rows(), stack)


WIRES: dict[str, Wire] = {"http": _http, "grpc": _grpc}


def _features_called(calls: dict[str, float]) -> dict[str, list[str]]:
    return {
        feature: sorted(name for name in calls if name.startswith(prefixes))
        for feature, (_, prefixes) in USES.items()
        if any(name.startswith(prefixes) for name in calls)
    }


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_a_model_that_uses_no_feature_runs_none_of_their_code(
    counted: tuple[CallCounter, RunningServer], wire: str
) -> None:
    counter, server = counted
    with ExitStack() as stack:
        request = WIRES[wire](server, "plain", stack)
        calls = calls_per_request(counter, request, REQUESTS, warmup=5)
    assert any(name.startswith("scheduling/batcher.py") for name in calls)  # it counted
    assert _features_called(calls) == {}


@pytest.mark.parametrize("feature", sorted(USES))
def test_the_count_sees_each_feature_on_the_model_that_uses_it(
    counted: tuple[CallCounter, RunningServer], feature: str
) -> None:
    counter, server = counted
    model, _ = USES[feature]
    headers = {"traceparent": TRACEPARENT} if feature == "tracing" else {}
    with ExitStack() as stack:
        request = _http(server, model, stack, headers)
        calls = calls_per_request(counter, request, REQUESTS, warmup=5)
    assert feature in _features_called(calls), sorted(calls)
