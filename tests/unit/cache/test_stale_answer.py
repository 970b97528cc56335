"""cache_step.stale_answer, what a degraded model's request path asks before routing: the
cached answer (fresh or kept past its TTL), its response parameters restored, keyed exactly
as run_cached keys it, for a model the registry really loaded. Clocks injected: no sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from inferd.cache import CacheSettings, LocalSettings, ResponseCache
from inferd.dataplane.cache_step import CACHE_HIT, request_key, run_cached, stale_answer
from inferd.events import CallContext, RequestRecord
from inferd.repository.model_state import ModelVersion
from inferd.repository.registry import ModelRegistry
from inferd.types import InferRequest, Tensor
from tests.support.cache_models import write_exec_model


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_exec_model(tmp_path, "cached")
    return tmp_path


def request(value: float, **parameters: object) -> InferRequest:
    x = Tensor("IN", "FP32", (1, 1), np.array([[value]], np.float32))
    return InferRequest("cached", "", [x], parameters=dict(parameters))  # type: ignore[arg-type]


def record() -> RequestRecord:
    return RequestRecord("cached", "1", CallContext("http"), 0)


async def loaded(repo: Path) -> tuple[ModelRegistry, ModelVersion]:
    registry = ModelRegistry(repo)
    registry.cache_enabled = registry.cache_local = True
    await registry.load_model("cached")
    mv = registry.get("cached")
    assert mv.cache is not None
    return registry, mv


def test_a_miss_then_fresh_then_stale_with_the_response_parameters(repo: Path) -> None:
    async def scenario() -> None:
        registry, mv = await loaded(repo)
        assert mv.cache is not None
        options = dataclasses.replace(mv.cache, ttl_s=10.0, stale_s=60.0)
        clock = Clock()
        cache = ResponseCache(CacheSettings(local=LocalSettings(1 << 20)), clock=clock)
        ask = request(3.0)
        assert await stale_answer(cache, options, mv, registry, ask, record()) is None

        # Filled by run_cached as the request path fills it: the model's answer and the
        # response parameters it gave.
        bound = mv.signature.bind(ask, False)

        async def execute() -> list[Tensor]:
            bound.response_parameters = {"execution": 1, "note": "é"}
            return [Tensor("OUT", "FP32", (1, 1), np.array([[3.0]], np.float32))]

        filled = record()
        await run_cached(cache, options, mv, registry, ask, bound, filled, execute)
        assert filled.cache == "miss"

        fresh = record()
        answer = await stale_answer(cache, options, mv, registry, ask, fresh)
        assert answer is not None
        outputs, parameters, stale = answer
        assert [t.name for t in outputs] == ["OUT"] and outputs[0].data.tolist() == [[3.0]]
        assert (parameters, stale) == ({"execution": 1, "note": "é"}, False)
        assert fresh.cache == CACHE_HIT and fresh.cache_ns > 0

        clock.now += 10  # past the TTL, within stale_s
        late = record()
        answer = await stale_answer(cache, options, mv, registry, ask, late)
        assert answer is not None and answer[2] is True
        assert answer[1] == {"execution": 1, "note": "é"} and late.cache == CACHE_HIT
        assert cache.stats[0].stale_hits == 1

        clock.now += 60  # past TTL + stale_s
        assert await stale_answer(cache, options, mv, registry, ask, record()) is None
        await registry.unload_all()

    asyncio.run(scenario())


def test_an_answer_without_response_parameters_gives_an_empty_dict(repo: Path) -> None:
    async def scenario() -> None:
        registry, mv = await loaded(repo)
        assert mv.cache is not None
        cache = ResponseCache(CacheSettings(local=LocalSettings(1 << 20)))
        ask = request(4.0)
        key = request_key(mv.cache, mv, registry, ask)
        assert key is not None  # the key run_cached uses, filled here directly

        async def run() -> list[Tensor]:
            return [Tensor("OUT", "FP32", (1, 1), np.array([[4.0]], np.float32))]

        await cache.get_or_run(key, mv.name, run)
        answer = await stale_answer(cache, mv.cache, mv, registry, ask, record())
        assert answer is not None and answer[1:] == ({}, False)
        assert [t.name for t in answer[0]] == ["OUT"]
        await registry.unload_all()

    asyncio.run(scenario())


def test_an_uncacheable_request_has_no_stale_answer(repo: Path) -> None:
    async def scenario() -> None:
        registry, mv = await loaded(repo)
        assert mv.cache is not None
        cache = ResponseCache(CacheSettings(local=LocalSettings(1 << 20)))
        ask = request(5.0, odd=object())  # a parameter with no canonical encoding
        assert request_key(mv.cache, mv, registry, ask) is None
        rec = record()
        assert await stale_answer(cache, mv.cache, mv, registry, ask, rec) is None
        assert rec.cache == "" and cache.stats[0].misses == 0  # no lookup made
        await registry.unload_all()

    asyncio.run(scenario())
