"""Canary routing: weighted splits, sticky keys, promote, roll back, automatic rollback.

What a request sees of the routing (the split, the sticky key, promote and roll back) is
checked over HTTP and gRPC; the routing calls themselves are the admin API's.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.async_infer import FAILED, OK, PROTOCOLS, AsyncInfer
from tests.support.lifecycle_models import VERSION_PY, write_plus_model, write_python_model
from tests.support.metrics_scrape import scrape, value
from tests.support.servers import RunningServer, run_server

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}


@pytest.fixture(scope="module")
def canary_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("canary_repo")
    write_plus_model(repo, "split", [1, 2], extra="version_policy: { all { } }")
    for protocol in PROTOCOLS:  # a rollback is for good: one guarded model per protocol
        write_python_model(
            repo,
            f"guarded_{protocol}",
            VERSION_PY.format(fail_version=2),
            extra="""
            version_policy: { all { } }
            parameters { key: "canary_weights" value: { string_value: '{"2": 50, "1": 50}' } }
            parameters { key: "canary_auto_rollback" value: { string_value: "true" } }
            parameters { key: "canary_min_requests" value: { string_value: "10" } }
            """,
            versions=(1, 2),
        )
    with run_server(repo, admin_api=True) as running:
        yield running


class Infer:
    """Requests to `split` over HTTP (JSON) or gRPC (tritonclient.grpc, the routing key as
    metadata): (the version that served, its output)."""

    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.http = server.client() if protocol == "http" else None
        self.grpc = (
            grpcclient.InferenceServerClient(server.grpc_address) if protocol == "grpc" else None
        )

    def __enter__(self) -> Infer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.http is not None:
            self.http.close()
        if self.grpc is not None:
            self.grpc.close()

    def __call__(self, request_id: str = "", routing_key: str = "") -> tuple[str, list[float]]:
        headers = {"inferd-routing-key": routing_key} if routing_key else {}
        if self.http is not None:
            r = self.http.post(
                "/v2/models/split/infer", json={**BODY, "id": request_id}, headers=headers
            )
            assert r.status_code == 200, r.text
            doc = r.json()
            return doc["model_version"], doc["outputs"][0]["data"]
        assert self.grpc is not None
        x = grpcclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.zeros((1, 4), np.float32))
        result = self.grpc.infer("split", [x], request_id=request_id, headers=headers)
        return result.get_response().model_version, result.as_numpy("y").ravel().tolist()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ten_percent_canary_gets_ten_percent(canary_server: RunningServer, protocol: str) -> None:
    with canary_server.client() as c:
        r = c.post("/v2/models/split/routing", json={"weights": {"2": 10, "1": 90}})
        assert r.status_code == 200, r.text
        assert r.json()["weights"] == {"2": 10, "1": 90}
    served: Counter[str] = Counter()
    with Infer(protocol, canary_server) as infer:
        for i in range(2000):
            version, data = infer(request_id=f"req-{i}")
            assert data == [float(version)] * 4
            served[version] += 1
    assert set(served) == {"1", "2"}
    assert 0.07 <= served["2"] / 2000 <= 0.13, served


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_routing_key_is_sticky(canary_server: RunningServer, protocol: str) -> None:
    with canary_server.client() as c:
        c.post("/v2/models/split/routing", json={"weights": {"2": 50, "1": 50}})
    with Infer(protocol, canary_server) as infer:
        for key in ("alice", "bob", "carol", "dave"):
            versions = {infer(routing_key=key)[0] for _ in range(20)}
            assert len(versions) == 1, (key, versions)
        # Keyed, requests go where their key says: both versions get some of the keys.
        keys = {infer(routing_key=f"user-{k}")[0] for k in range(40)}
    assert keys == {"1", "2"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_promote_and_roll_back_are_single_calls(
    canary_server: RunningServer, protocol: str
) -> None:
    with canary_server.client() as c, Infer(protocol, canary_server) as infer:

        def versions_served() -> set[str]:
            return {infer()[0] for _ in range(30)}

        c.post("/v2/models/split/routing", json={"weights": {"2": 10, "1": 90}})
        promoted = c.post("/v2/models/split/routing/promote", json={"version": "2"}).json()
        assert promoted["weights"] == {"2": 100}
        assert versions_served() == {"2"}
        # Rolling back a promotion restores the split it came from...
        undone = c.post("/v2/models/split/routing/rollback", json={}).json()
        assert undone["weights"] == {"2": 10, "1": 90}
        # ...and rolling back a canary sends its traffic to the stable version.
        rolled = c.post("/v2/models/split/routing/rollback", json={}).json()
        assert rolled["weights"] == {"2": 0, "1": 90}
        assert versions_served() == {"1"}
        # An explicit version still reaches a version with weight 0.
        assert c.post("/v2/models/split/versions/2/infer", json=BODY).json()["model_version"] == "2"
        r = c.post("/v2/models/split/routing/rollback", json={"version": "1"})
        assert r.status_code == 400
        assert "not a canary" in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"weights": {"3": 10}}, ["version 3", "not loaded"]),
        ({"weights": {"2": -1}}, ["weight", ">= 0"]),
        ({"weights": {"x": 1}}, ["version 'x'"]),
        ({"weights": {"1": 0}}, ["> 0"]),
        ({"weights": []}, ["weights must be an object"]),
    ],
)
def test_bad_weights_are_rejected(
    canary_server: RunningServer, body: dict[str, object], words: list[str]
) -> None:
    with canary_server.client() as c:
        r = c.post("/v2/models/split/routing", json=body)
    assert r.status_code == 400
    for word in words:
        assert word in r.json()["error"]


def test_routing_over_grpc_admin_service(canary_server: RunningServer) -> None:
    channel = grpc.insecure_channel(canary_server.grpc_address)

    def call(method: str, doc: dict[str, object]) -> dict[str, object]:
        fn = channel.unary_unary(f"/inferd.admin.v1.Admin/{method}")
        return json.loads(fn(json.dumps(doc).encode()))  # type: ignore[no-any-return]

    assert call("SetRouting", {"model": "split", "weights": {"2": 25, "1": 75}})["weights"] == {
        "2": 25,
        "1": 75,
    }
    assert call("GetRouting", {"model": "split"})["stable"] == "1"
    assert call("Promote", {"model": "split", "version": "1"})["weights"] == {"1": 100}
    with pytest.raises(grpc.RpcError) as info:
        call("SetRouting", {"model": "nope", "weights": {"1": 1}})
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    channel.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failing_canary_is_rolled_back_automatically(
    canary_server: RunningServer, protocol: str
) -> None:
    guarded = f"guarded_{protocol}"

    async def send(n: int) -> list[tuple[str, str]]:
        """n requests, one after the other: (status, the version that answered)."""
        async with AsyncInfer(protocol, canary_server) as infer:
            return [(r.status, r.version) for r in [await infer(guarded, 1) for _ in range(n)]]

    with canary_server.client() as c:
        assert c.get(f"/v2/models/{guarded}/routing").json()["weights"] == {"2": 50, "1": 50}
        before = asyncio.run(send(200))
        routing = c.get(f"/v2/models/{guarded}/routing").json()
    after = asyncio.run(send(50))
    assert FAILED[protocol] in {status for status, _ in before}  # it failed, then rolled back
    assert routing["weights"]["2"] == 0
    assert routing["rollbacks"] == {"2": 1}
    assert set(after) == {(OK[protocol], "1")}
    metrics = scrape(canary_server)
    assert value(metrics, "inferd_canary_rollbacks_total", model=guarded, version="2") == 1
    assert value(metrics, "inferd_routing_weight", model=guarded, version="2") == 0


def test_admin_calls_are_refused_when_the_api_is_off(good_repository: Path) -> None:
    with run_server(good_repository) as running, running.client() as c:
        r = c.post("/v2/models/mlp/routing", json={"weights": {"1": 100}})
        assert r.status_code == 403
        assert "--admin-api" in r.json()["error"]
        assert c.get("/v2/models/mlp/routing").status_code == 200  # reading is always allowed
