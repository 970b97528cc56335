"""examples/config-reference loads, and each feature its config shows is in effect, over
HTTP and gRPC with Triton's clients: version policy, instance groups, priorities, queue
policy and warm-up (docs/model-config.md)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inferd.repository.model_state import State
from inferd.repository.registry import ModelRegistry
from inferd.repository.warmup import warmup_samples
from inferd.scheduling.queues import QueuePolicy
from tests.support.models import EXAMPLES, builders
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

MODEL = "classifier"
ROWS = np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16)


def build_reference(target: Path) -> Path:
    """The example repository as a user gets it: the committed config plus built files."""
    shutil.copytree(EXAMPLES / "config-reference", target, dirs_exist_ok=True)
    builders.build_config_reference(target)
    return target


@pytest.fixture(scope="module")
def reference_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reference(tmp_path_factory.mktemp("config_reference"))


@pytest.fixture(scope="module")
def reference(reference_repo: Path) -> Iterator[RunningServer]:
    with run_server(reference_repo) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, reference: RunningServer) -> Iterator[Client]:
    c = Client(request.param, reference)
    yield c
    c.raw.close()


def _config(client: Client) -> dict[str, object]:
    if client.protocol == "http":
        doc: dict[str, object] = client.raw.get_model_config(MODEL)
        return doc
    return dict(client.raw.get_model_config(MODEL, as_json=True)["config"])


def test_the_version_policy_serves_the_two_newest(client: Client) -> None:
    index = client.raw.get_model_repository_index(
        **({} if client.protocol == "http" else {"as_json": True})
    )
    rows = index if client.protocol == "http" else index["models"]
    assert [(r["name"], r.get("version"), r.get("state")) for r in rows] == [
        (MODEL, "2", "READY"),
        (MODEL, "3", "READY"),
    ]
    assert client.raw.is_model_ready(MODEL, "2")
    assert client.raw.is_model_ready(MODEL, "3")
    with pytest.raises(InferenceServerException, match="unknown version '1'"):
        client.infer(MODEL, {"input": (ROWS, "FP32")}, model_version="1")
    result = client.infer(MODEL, {"input": (ROWS, "FP32")})
    response = result.get_response()
    version = response["model_version"] if client.protocol == "http" else response.model_version
    assert version == "3"  # no version asked: the highest ready one


def test_versions_compute_their_own_weights(client: Client) -> None:
    two = client.infer(MODEL, {"input": (ROWS, "FP32")}, model_version="2")
    three = client.infer(MODEL, {"input": (ROWS, "FP32")}, model_version="3")
    assert not np.allclose(two.as_numpy("probabilities"), three.as_numpy("probabilities"))


def test_the_instance_group_runs_two_cpu_instances(
    client: Client, reference: RunningServer
) -> None:
    group: dict[str, Any]
    (group,) = _config(client)["instance_group"]  # type: ignore[misc]
    assert group["name"] == "classifier_cpu"
    assert int(group["count"]) == 2
    assert group["kind"] == "KIND_CPU"
    for version in ("2", "3"):
        assert reference.server.registry.get(MODEL, version).devices == ["cpu", "cpu"]


def test_priorities_are_levels_one_and_two(client: Client) -> None:
    for priority in (1, 2):
        client.infer(MODEL, {"input": (ROWS, "FP32")}, priority=priority)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, {"input": (ROWS, "FP32")}, priority=3)
    assert "priority 3 is outside 1..2 (priority_levels" in str(info.value)


def test_a_request_may_shorten_its_queue_timeout(client: Client) -> None:
    """allow_timeout_override: a 1 µs timeout cannot be met once an execution was timed, so
    deadline-aware admission refuses it at once as the request's own error, shorter than one
    execution (without the override it would be ignored)."""
    client.infer(MODEL, {"input": (ROWS, "FP32")}, priority=1)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, {"input": (ROWS, "FP32")}, priority=1, timeout=1)
    assert "cannot answer within the request's deadline" in str(info.value)
    status = "400" if client.protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert str(info.value.status()) == status


def test_the_queue_policies_reach_the_scheduler(reference: RunningServer) -> None:
    options = reference.server.registry.get(MODEL).spec.batching
    assert options.queue_policies == (
        QueuePolicy(max_queue_size=16, default_timeout_us=200_000, allow_timeout_override=True),
        QueuePolicy(max_queue_size=64, default_timeout_us=1_000_000, allow_timeout_override=True),
    )
    assert options.default_priority == 1  # level 2, counted from 0
    assert options.preferred_sizes == (4, 8)


def test_the_configured_warmup_ran_before_ready(
    reference: RunningServer, reference_repo: Path
) -> None:
    mv = reference.server.registry.get(MODEL)
    samples = warmup_samples(mv.config, reference_repo / MODEL)
    assert [(name, count) for name, _, count in samples] == [
        ("full batch of random rows", 2),
        ("recorded request", 1),
    ]
    recorded = samples[1][1]["input"]
    np.testing.assert_array_equal(recorded, np.linspace(-1, 1, 16, dtype=np.float32)[None])
    assert mv.warmup_duration_s > 0


def test_a_missing_warmup_file_keeps_the_version_out_of_service(tmp_path: Path) -> None:
    """The recorded request is really read at load: without it no version becomes ready."""
    repo = build_reference(tmp_path / "repo")
    (repo / MODEL / "warmup" / "sample_input").unlink()

    async def load() -> ModelRegistry:
        registry = ModelRegistry(repo)
        await registry.load_all()
        await registry.unload_all()
        return registry

    registry = asyncio.run(load())
    model = registry.models[MODEL]
    assert all(v.state is State.UNAVAILABLE for v in model.versions.values())
    reason = next(iter(model.versions.values())).reason
    assert "model_warmup 'recorded request'" in reason
    assert "classifier/warmup/sample_input not found" in reason
