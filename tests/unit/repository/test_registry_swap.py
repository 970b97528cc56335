"""The registry's swap rules, without a server: a Python model (the real python backend, in
its default thread isolation) on a repository in a temporary folder.

A new version swaps in; a broken one leaves the old one serving, the reason on its row; an
unchanged reload keeps the very same version object; unload takes the model out of service;
what is kept per version goes when the version's unload completes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from inferd.errors import InferdError
from inferd.events import Gone, Telemetry
from inferd.repository.model_state import ModelVersion, State
from inferd.repository.registry import ModelRegistry
from inferd.tensors.signature import BoundRequest

CONFIG = """
name: "swap"
backend: "python"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

# OUT = IN + PLUS: the answer says which files computed it.
PLUS_MODEL = """
class Model:
    def predict(self, inputs):
        return {{"OUT": inputs["IN"] + {plus}}}
"""

BROKEN_MODEL = """
class Model:
    def load(self, context):
        raise RuntimeError("this version cannot load")

    def predict(self, inputs):
        return {"OUT": inputs["IN"]}
"""


def _write_version(repo: Path, version: int, source: str) -> None:
    folder = repo / "swap" / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "swap").mkdir()
    (tmp_path / "swap" / "config.pbtxt").write_text(CONFIG)
    _write_version(tmp_path, 1, PLUS_MODEL.format(plus=1.0))
    return tmp_path


async def _answer(mv: ModelVersion, value: float) -> float:
    """One request through the version's own scheduler and instance."""
    assert mv.batcher is not None
    request = BoundRequest(
        inputs={"IN": np.array([[value]], np.float32)},
        rows=1,
        shape_key=((1,),),
        output_names=["OUT"],
    )
    outputs, _ = await mv.batcher.submit(request)
    return float(outputs["OUT"][0, 0])


def _row(registry: ModelRegistry, version: str) -> dict[str, object]:
    (row,) = (r for r in registry.index() if r.get("version") == version)
    return row


def test_a_new_version_swaps_in_and_the_old_one_retires(repo: Path) -> None:
    async def scenario() -> None:
        registry = ModelRegistry(repo)
        await registry.load_model("swap")
        first = registry.get("swap")
        assert (first.version, await _answer(first, 10.0)) == ("1", 11.0)

        _write_version(repo, 2, PLUS_MODEL.format(plus=2.0))
        await registry.load_model("swap")
        second = registry.get("swap")
        assert (second.version, await _answer(second, 10.0)) == ("2", 12.0)
        # Only the latest version is selected (the default policy): 1 drained and closed.
        assert first.state is State.UNAVAILABLE and first.batcher is None
        assert [r["version"] for r in registry.index()] == ["2"]
        await registry.unload_all()

    asyncio.run(scenario())


def test_changed_files_of_the_same_version_swap_in_a_new_object(repo: Path) -> None:
    async def scenario() -> None:
        registry = ModelRegistry(repo)
        await registry.load_model("swap")
        old = registry.get("swap")
        _write_version(repo, 1, PLUS_MODEL.format(plus=5.0))
        await registry.load_model("swap")
        new = registry.get("swap")
        assert new is not old and new.is_ready
        assert await _answer(new, 1.0) == 6.0
        assert old.state is State.UNAVAILABLE and old.reason == "unloaded"
        await registry.unload_all()

    asyncio.run(scenario())


def test_a_broken_replacement_leaves_the_old_version_serving(repo: Path) -> None:
    async def scenario() -> None:
        registry = ModelRegistry(repo)
        await registry.load_model("swap")
        serving = registry.get("swap")
        _write_version(repo, 1, BROKEN_MODEL)
        with pytest.raises(InferdError) as failed:
            await registry.load_model("swap")
        assert "this version cannot load" in failed.value.message
        assert "still serving version 1" in failed.value.message

        assert registry.get("swap") is serving and serving.is_ready
        assert await _answer(serving, 1.0) == 2.0  # the old files still answer
        row = _row(registry, "1")
        assert row["state"] == "READY"
        reason = str(row["reason"])
        assert reason.startswith("reload failed, still serving the loaded files")
        assert "this version cannot load" in reason
        assert registry.is_ready()

        # Fixed files swap in, and the failure is history on the row.
        _write_version(repo, 1, PLUS_MODEL.format(plus=3.0))
        await registry.load_model("swap")
        fixed = registry.get("swap")
        assert fixed is not serving and await _answer(fixed, 1.0) == 4.0
        assert "reason" not in _row(registry, "1")
        await registry.unload_all()

    asyncio.run(scenario())


def test_a_broken_new_version_beside_a_working_one_is_listed_with_its_reason(
    repo: Path,
) -> None:
    async def scenario() -> None:
        (repo / "swap" / "config.pbtxt").write_text(CONFIG + "version_policy: { all: { } }\n")
        registry = ModelRegistry(repo)
        await registry.load_model("swap")
        serving = registry.get("swap")
        _write_version(repo, 2, BROKEN_MODEL)
        with pytest.raises(InferdError):
            await registry.load_model("swap")
        # The default route stays on the ready version; the broken one says why it is not.
        assert registry.get("swap") is serving
        row = _row(registry, "2")
        assert row["state"] == "UNAVAILABLE"
        assert "this version cannot load" in str(row["reason"])
        with pytest.raises(InferdError) as refused:
            registry.get("swap", "2")
        assert "this version cannot load" in refused.value.message
        await registry.unload_all()

    asyncio.run(scenario())


def test_an_unchanged_reload_keeps_the_same_version_object(repo: Path) -> None:
    async def scenario() -> None:
        registry = ModelRegistry(repo)
        await registry.load_model("swap")
        before = registry.get("swap")
        scheduler = before.batcher
        await registry.load_model("swap")
        after = registry.get("swap")
        assert after is before and after.batcher is scheduler and after.is_ready
        assert await _answer(after, 0.0) == 1.0
        await registry.unload_all()

    asyncio.run(scenario())


def test_unload_takes_the_model_out_of_service(repo: Path) -> None:
    async def scenario() -> None:
        registry = ModelRegistry(repo)
        await registry.load_model("swap")
        loaded = registry.get("swap")
        await registry.unload_model("swap")
        assert loaded.state is State.UNAVAILABLE and loaded.batcher is None
        with pytest.raises(InferdError) as refused:
            registry.get("swap")
        assert refused.value.message == "model 'swap' has no ready version: unloaded"
        assert registry.index() == [{"name": "swap", "state": "UNAVAILABLE", "reason": "unloaded"}]
        assert registry.is_ready()  # unloaded on request: it does not hold readiness down

        await registry.unload_model("swap", forget=True)
        assert registry.index() == []
        with pytest.raises(InferdError, match="unknown model 'swap'"):
            registry.get("swap")

    asyncio.run(scenario())


class _Keeper:
    """A part keeping state per version: what each `forget` said was gone."""

    KEYS = (("swap", "1"), ("swap", "2"), ("swap", ""), ("", ""))

    def __init__(self) -> None:
        self.calls: list[set[tuple[str, str]]] = []

    def forget(self, gone: Gone) -> None:
        self.calls.append({key for key in self.KEYS if gone(*key)})


def test_what_is_kept_for_a_version_goes_when_its_unload_completes(repo: Path) -> None:
    async def scenario() -> None:
        keeper = _Keeper()
        telemetry = Telemetry()
        telemetry.keeps(keeper)
        registry = ModelRegistry(repo, telemetry)
        await registry.load_model("swap")
        router = registry.models["swap"].router
        router.set_weights({"1": 100}, {"1"}, "swap")
        router.guard_rollback("1")
        # New files, same number: the version stays (its series go on).
        _write_version(repo, 1, PLUS_MODEL.format(plus=5.0))
        await registry.load_model("swap")
        assert keeper.calls == [{("swap", "2")}]  # (never loaded)
        assert registry.holds("swap", "1") and router.rollbacks == {"1": 1}

        _write_version(repo, 2, PLUS_MODEL.format(plus=2.0))
        await registry.load_model("swap")  # 1 swapped out, drained, unloaded
        assert keeper.calls[-1] == {("swap", "1")}
        assert router.weights == {} and router.rollbacks == {}

        await registry.unload_model("swap")  # the whole model: its own series go too
        assert keeper.calls[-1] == {("swap", "1"), ("swap", "2"), ("swap", "")}
        assert not registry.holds("swap", "") and registry.holds("", "")
        await registry.load_model("swap")
        assert registry.holds("swap", "") and registry.holds("swap", "2")
        await registry.unload_model("swap", forget=True)  # out of the repository
        assert keeper.calls[-1] == {("swap", "1"), ("swap", "2"), ("swap", "")}

    asyncio.run(scenario())
