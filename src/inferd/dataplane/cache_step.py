"""One request through the response cache (docs/cache.md): its key, the lookup, and on a
miss the execution, whose final output tensors become the entry.

Runs below the adapters, in `InferenceSteps._serve`, after the version is chosen (canary
routing included) and the inputs are checked, so HTTP, gRPC, `--workers N` and the engine of
`--engine` all go through it once. What is cached is what the response is built from: the
outputs after conformance and classification, before a shared-memory lease writes them, so
a hit is written into the request's own regions the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.cache.keys import CacheKey, UncacheableRequestError, cache_key
from inferd.cache.response_cache import ResponseCache
from inferd.errors import ErrorKind, InferdError
from inferd.events import RequestRecord
from inferd.tensors.signature import BoundRequest
from inferd.types import InferRequest, Tensor

if TYPE_CHECKING:
    from inferd.cache.cache_settings import CacheSettings
    from inferd.cache.model_cache_spec import CacheOptions
    from inferd.repository.model_state import ModelVersion
    from inferd.repository.registry import ModelRegistry

# A Python model's response parameters travel in the entry as one extra tensor under a name
# no model output can have (config names are identifiers), so a hit answers with them too.
PARAMETERS_TENSOR = "\x00response_parameters"

CACHE_HIT = "hit"
CACHE_MISS = "miss"
# Waited for an identical concurrent request's execution (single flight): neither a hit (no
# tier had the answer) nor an execution of its own; its wait counts as queue time.
CACHE_COALESCED = "coalesced"


def build_cache(settings: CacheSettings | None, registry: ModelRegistry) -> ResponseCache | None:
    """The server process's one ResponseCache (None without --cache-config), wired into its
    registry: models load with it, retired versions' entries are dropped."""
    if settings is None or not settings.enabled:
        return None
    cache = ResponseCache(settings)
    registry.cache_enabled = True
    registry.cache_local = settings.local is not None
    registry.on_retire = cache.invalidate_model
    return cache


async def run_cached(
    cache: ResponseCache,
    options: CacheOptions,
    mv: ModelVersion,
    registry: ModelRegistry,
    request: InferRequest,
    bound: BoundRequest,
    record: RequestRecord,
    execute: Callable[[], Awaitable[list[Tensor]]],
) -> list[Tensor]:
    """The outputs for `request`, from the cache or from `execute()`; fills the record's
    cache outcome and duration (Triton's cache_hit / cache_miss statistics, or inferd's
    `coalesced`) and `bound.response_parameters` as the model gave them."""
    key = request_key(options, mv, registry, request)
    if key is None:
        return await execute()
    run_ns = -1  # stays -1 unless this request's own execution ran
    started = False  # whether this request ran (led its flight), successfully or not

    async def run() -> list[Tensor]:
        nonlocal run_ns, started
        started = True
        t0 = time.perf_counter_ns()
        tensors = await execute()
        run_ns = time.perf_counter_ns() - t0
        if bound.response_parameters:
            return [*tensors, _parameters_tensor(bound.response_parameters)]
        return tensors

    t0 = time.perf_counter_ns()
    try:
        tensors, source = await cache.get_or_run(
            key,
            mv.name,
            run,
            ttl_s=options.ttl_s,
            max_entries=options.max_entries,
            max_response_bytes=options.max_response_bytes,
            stale_s=options.stale_s,
        )
    except InferdError as exc:
        if started or exc.kind in SHARED_FAILURES:
            raise  # its own run's failure, or a failed execution it shares
        # The identical request this one waited for failed for a reason that may be its own
        # (its deadline, its priority shed, its client gone): not this request's answer. It
        # runs itself, with its own deadline and priority, uncached.
        return await execute()
    elapsed = time.perf_counter_ns() - t0
    if run_ns >= 0:
        # Triton's cache_miss: the lookup and the insert, not the execution.
        record.cache, record.cache_ns = CACHE_MISS, max(0, elapsed - run_ns)
    elif source:
        # A tier's answer (found by this request, or by the identical one it waited on).
        record.cache, record.cache_ns = CACHE_HIT, elapsed
    else:
        # The identical request it waited on executed: no tier had the answer and this one
        # executed nothing. Its time is its wait.
        record.cache, record.cache_ns = CACHE_COALESCED, elapsed
    if tensors and tensors[-1].name == PARAMETERS_TENSOR:
        *outputs, carried = tensors
        if run_ns < 0:  # this request's own run already left them in `bound`
            bound.response_parameters = json.loads(carried.data.reshape(-1)[0])
        return outputs
    return list(tensors)  # the cache's list stays the cache's


async def stale_answer(
    cache: ResponseCache,
    options: CacheOptions,
    mv: ModelVersion,
    registry: ModelRegistry,
    request: InferRequest,
    record: RequestRecord,
) -> tuple[list[Tensor], dict[str, Any], bool] | None:
    """For a degraded model, before routing: the cached answer to `request`, fresh or kept
    past its TTL (options.stale_s), as (outputs, response parameters, is_stale); None when
    no tier has one or the request is not cacheable. Never runs the model; an answer fills
    the record as a hit does."""
    key = request_key(options, mv, registry, request)
    if key is None:
        return None
    t0 = time.perf_counter_ns()
    found = await cache.lookup_stale(key, mv.name)
    if found is None:
        return None
    tensors, stale = found
    parameters: dict[str, Any] = {}
    if tensors and tensors[-1].name == PARAMETERS_TENSOR:
        *tensors, carried = tensors
        parameters = json.loads(carried.data.reshape(-1)[0])
    record.cache, record.cache_ns = CACHE_HIT, time.perf_counter_ns() - t0
    return tensors, parameters, stale


def request_key(
    options: CacheOptions, mv: ModelVersion, registry: ModelRegistry, request: InferRequest
) -> CacheKey | None:
    """The request's key; None when it is not cached: an ensemble whose steps could answer
    from more than one version, or a parameter value with no canonical encoding."""
    version = mv.cache_version if mv.ensemble is None else ensemble_version(registry, mv)
    if version is None:
        return None
    try:
        return cache_key(
            mv.name, version, request.inputs, request.outputs, request.parameters, options.key
        )
    except UncacheableRequestError:
        return None


# A failed execution is every identical request's answer (no stampede of failing runs); any
# other failure of the request that ran (a deadline, a shed, an unmeetable deadline refused)
# may be that request's own.
SHARED_FAILURES = frozenset({ErrorKind.MODEL_ERROR, ErrorKind.INTERNAL})


def ensemble_version(registry: ModelRegistry, mv: ModelVersion) -> str | None:
    """An ensemble's version as its answers depend on it: its own files and config and, per
    step, the version of the composing model that step would run now (so loading a new
    version of a step's model never meets the old one's answers). None while a step could go
    to more than one version (canary weights between them): not cached then."""
    assert mv.ensemble is not None
    parts = [mv.cache_version]
    for step in mv.ensemble.graph.steps:
        model = registry.models.get(step.model)
        if model is None:
            return None
        routed = [v for v, w in model.router.weights.items() if w > 0]
        if step.version:
            target = model.versions.get(step.version)
        elif len(routed) > 1:
            return None  # canary weights: the step's version is picked per request
        else:  # as ModelRegistry.get picks it
            target = model.versions.get(routed[0]) if routed else None
            if target is None or not target.is_ready:
                target = model.default_version()
        if target is None:
            return None
        parts.append(f"{step.model}={target.cache_version}")
    return "|".join(parts)


def _parameters_tensor(parameters: dict[str, Any]) -> Tensor:
    data = np.array([json.dumps(parameters).encode()], dtype=object)
    return Tensor(PARAMETERS_TENSOR, "BYTES", (1,), data)
