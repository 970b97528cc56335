"""The response cache end to end, in one server process with a local tier (docs/cache.md):
hits over HTTP and gRPC (tritonclient, one case table), Triton's statistics and metrics, no
stampede, opt-in normalisation, version swaps, eviction by bytes, and models the cache
leaves alone. Redis, --engine and several processes: test_response_cache_redis.py."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format

from inferd.cache.cache_settings import parse_cache_config
from tests.support.async_infer import OK, AsyncInfer
from tests.support.cache_models import CACHED, param, write_exec_model, write_params_model
from tests.support.ensemble_models import ensemble_config, step, write_ensemble
from tests.support.metrics_scrape import scrape_url, value
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cache_repo")
    write_exec_model(repo, "cached")
    write_exec_model(repo, "slow", delay_ms=200)  # 64 identical requests overlap its run
    write_exec_model(repo, "held", gate=repo / "held" / "gate")  # runs wait while it exists
    write_exec_model(repo, "plain", cached=False)
    write_exec_model(repo, "rounded", extra=param("cache_float_decimals", "2"))
    write_exec_model(
        repo,
        "texts",
        datatype="TYPE_STRING",
        extra=param("cache_text_normalize", "strip,lower,nfc"),
    )
    write_exec_model(repo, "raw_texts", datatype="TYPE_STRING")
    write_exec_model(repo, "small", extra=param("cache_max_response_bytes", "512"))
    write_exec_model(repo, "bounded", extra=param("cache_max_entries", "2"))
    write_exec_model(repo, "brief", extra=param("cache_ttl_seconds", "0.2"))
    write_params_model(repo)
    # The top-level ensemble cached (as Triton does), its step's model not.
    steps = [step("plain", {"IN": "IN"}, {"OUT": "OUT"})]
    write_ensemble(repo, "pipe", ensemble_config("pipe", steps, 64, extra=CACHED))
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    settings = parse_cache_config(["local,size=4M"])
    with run_server(repo, cache=settings, metrics_triton_names=True) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


def stats(server: RunningServer, model: str) -> dict[str, Any]:
    doc = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=10).json()
    entry: dict[str, Any] = doc["model_stats"][0]
    return entry


def stats_over(client: Client, model: str) -> dict[str, Any]:
    """The statistics as the client's own protocol serves them (gRPC: uint64 as ints)."""
    if client.protocol == "http":
        return client.raw.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]
    message = client.raw.get_inference_statistics(model)
    doc = json_format.MessageToDict(message, preserving_proto_field_name=True)
    entry = doc["model_stats"][0]
    return json.loads(json.dumps(entry), parse_int=int, parse_float=float)  # type: ignore[no-any-return]


def _count(entry: dict[str, Any], field: str) -> int:
    return int(entry["inference_stats"][field].get("count", 0))


def _infer(client: Client, model: str, values: list[float]) -> tuple[np.ndarray, int]:
    result = client.infer(model, {"IN": (np.array([values], np.float32), "FP32")})
    return result.as_numpy("OUT"), int(result.as_numpy("EXEC")[0, 0])


def _texts(client: Client, model: str, texts: list[str]) -> tuple[list[bytes], int]:
    array = np.array([[t.encode() for t in texts]], dtype=object)
    result = client.infer(model, {"IN": (array, "BYTES")})
    return list(result.as_numpy("OUT")[0]), int(result.as_numpy("EXEC")[0, 0])


# -- hits ------------------------------------------------------------------------------------


def test_a_hit_after_a_miss_answers_the_same_without_executing(client: Client) -> None:
    server_stats = stats_over(client, "cached")
    values = [1.5, 2.5] if client.protocol == "http" else [3.5, 4.5]  # each its own key
    first, first_exec = _infer(client, "cached", values)
    second, second_exec = _infer(client, "cached", values)
    np.testing.assert_array_equal(first, second)
    assert second_exec == first_exec  # the same execution's answer
    after = stats_over(client, "cached")
    assert _count(after, "cache_miss") == _count(server_stats, "cache_miss") + 1
    assert _count(after, "cache_hit") == _count(server_stats, "cache_hit") + 1
    # As Triton: success counts hits; inference and execution counts do not.
    assert _count(after, "success") == _count(server_stats, "success") + 2
    assert int(after["inference_count"]) == int(server_stats.get("inference_count", 0)) + 1
    assert int(after["execution_count"]) == int(server_stats.get("execution_count", 0)) + 1
    assert _count(after, "compute_infer") == _count(server_stats, "compute_infer") + 1


def test_a_model_without_the_cache_is_not_cached(client: Client, server: RunningServer) -> None:
    _, first = _infer(client, "plain", [7.0])
    _, second = _infer(client, "plain", [7.0])
    assert second != first
    entry = stats(server, "plain")
    assert _count(entry, "cache_hit") == _count(entry, "cache_miss") == 0


def test_request_parameters_and_requested_outputs_are_part_of_the_key(
    server: RunningServer,
) -> None:
    def execution(**extra: Any) -> int:
        body: dict[str, Any] = {
            "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [42.0]}],
            **extra,
        }
        r = httpx.post(f"{server.url}/v2/models/cached/infer", json=body, timeout=10)
        assert r.status_code == 200, r.text
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        return int(outputs["EXEC"]["data"][0])

    variants: list[dict[str, Any]] = [
        {},
        {"parameters": {"tenant": "a"}},
        {"parameters": {"tenant": "b"}},
        {"parameters": {"tenant": 1}},  # typed: 1 is not "1"
        {"parameters": {"tenant": "1"}},
        {"outputs": [{"name": "EXEC"}]},  # other outputs asked for
        {"outputs": [{"name": "EXEC"}, {"name": "OUT", "parameters": {"classification": 1}}]},
    ]
    first = [execution(**v) for v in variants]
    assert len(set(first)) == len(variants)  # each its own entry: each executed
    assert [execution(**v) for v in variants] == first  # and each then a hit on its own


def test_a_hit_keeps_the_models_response_parameters(client: Client) -> None:
    x = {
        "IN": (
            np.array([5.0, 6.0] if client.protocol == "http" else [7.0, 8.0], np.float32),
            "FP32",
        )
    }
    first = client.infer("with_params", x).get_response()
    second = client.infer("with_params", x).get_response()
    if client.protocol == "http":
        params = [r["parameters"] for r in (first, second)]
    else:
        params = [{k: v.int64_param for k, v in r.parameters.items()} for r in (first, second)]
    assert params[0] == params[1]
    assert params[0]["execution"] >= 1


def test_an_ensemble_hit_runs_none_of_its_steps(client: Client, server: RunningServer) -> None:
    x = {"IN": (np.array([[8.0 if client.protocol == "http" else 9.0]], np.float32), "FP32")}
    before, step_before = stats(server, "pipe"), stats(server, "plain")
    first = client.infer("pipe", x).as_numpy("OUT")
    second = client.infer("pipe", x).as_numpy("OUT")
    np.testing.assert_array_equal(first, second)
    after, step_after = stats(server, "pipe"), stats(server, "plain")
    assert _count(after, "cache_hit") - _count(before, "cache_hit") == 1
    assert after["inference_count"] - before["inference_count"] == 1
    assert step_after["inference_count"] - step_before["inference_count"] == 1  # one run


def test_a_hit_writes_shared_memory_outputs_as_a_miss_does(client: Client) -> None:
    key = f"/inferd-cache-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key.lstrip("/"), key, 64)
    region = f"out_{client.protocol}"
    x = np.array([[11.0, 12.0] if client.protocol == "http" else [13.0, 14.0]], np.float32)
    try:
        client.raw.register_system_shared_memory(region, key, 64)
        answers = []
        for _ in range(2):
            shm.set_shared_memory_region(handle, [np.zeros((1, 2), np.float32)])
            inp = client.mod.InferInput("IN", [1, 2], "FP32")
            inp.set_data_from_numpy(x)
            out = client.mod.InferRequestedOutput("OUT")
            out.set_shared_memory(region, 8)
            result = client.raw.infer(
                "cached", [inp], outputs=[out, client.mod.InferRequestedOutput("EXEC")]
            )
            written = shm.get_contents_as_numpy(handle, np.float32, [1, 2])
            answers.append((written.tolist(), int(result.as_numpy("EXEC")[0, 0])))
        assert answers[0] == answers[1]  # the same execution's answer, written again
        assert answers[0][0] == x.tolist()
    finally:
        client.raw.unregister_system_shared_memory(region)
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_64_identical_concurrent_requests_execute_once(
    server: RunningServer, protocol: str
) -> None:
    before = stats(server, "slow")
    value = 64.0 if protocol == "http" else 65.0

    async def scenario() -> list[Any]:
        async with AsyncInfer(protocol, server, connections=64) as infer:
            return await asyncio.gather(*(infer("slow", value) for _ in range(64)))

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [OK[protocol]] * 64
    assert {tuple(r.data) for r in replies} == {(value,)}
    after = stats(server, "slow")  # the server's own count: one execution of one row
    assert after["inference_count"] - before["inference_count"] == 1
    assert after["execution_count"] - before["execution_count"] == 1
    assert _count(after, "cache_miss") - _count(before, "cache_miss") == 1
    # The others waited for that execution (coalesced) or came after it (hits).
    hits = _count(after, "cache_hit") - _count(before, "cache_hit")
    waited = after["coalesced"]["count"] - before["coalesced"]["count"]
    assert hits + waited == 63


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_requests_that_waited_for_an_identical_execution_are_neither_hits_nor_executions(
    server: RunningServer, repo: Path, protocol: str
) -> None:
    """Single flight: 8 identical requests while the first one's execution is held. The 7
    that waited for it count in success and queue (their wait) and in inferd's `coalesced`
    field and metric; Triton's cache_hit counts what a tier answered, and nothing counts
    an execution of theirs."""
    cache = server.server.response_cache
    assert cache is not None
    value_ = 70.0 if protocol == "http" else 71.0  # each protocol its own key
    gate = repo / "held" / "gate"
    before, joined = stats(server, "held"), cache.coalesced
    metric_before = scrape_url(server.metrics_url)

    async def scenario() -> list[Any]:
        async with AsyncInfer(protocol, server, connections=8) as infer:
            gate.touch()
            try:
                calls = [asyncio.create_task(infer("held", value_)) for _ in range(8)]
                deadline = time.monotonic() + 30
                while cache.coalesced - joined < 7:  # all 7 joined the first one's flight
                    assert time.monotonic() < deadline, cache.coalesced - joined
                    await asyncio.sleep(0.002)
            finally:
                gate.unlink()
            return await asyncio.gather(*calls)

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [OK[protocol]] * 8
    after = stats(server, "held")
    assert _count(after, "success") - _count(before, "success") == 8
    assert _count(after, "cache_miss") - _count(before, "cache_miss") == 1
    assert _count(after, "cache_hit") - _count(before, "cache_hit") == 0  # no tier answered
    assert after["coalesced"]["count"] - before["coalesced"]["count"] == 7
    assert after["coalesced"]["ns"] > before["coalesced"]["ns"]
    # Queue: the leader's time in the batcher's queue and the 7 waits, one count each.
    assert _count(after, "queue") - _count(before, "queue") == 8
    assert after["execution_count"] - before["execution_count"] == 1
    assert _count(after, "compute_infer") - _count(before, "compute_infer") == 1
    # The statistics as the client's own protocol serves them (gRPC: Triton's fields only).
    client = Client(protocol, server)
    over = stats_over(client, "held")
    client.raw.close()
    assert _count(over, "cache_hit") == _count(after, "cache_hit")
    assert _count(over, "success") == _count(after, "success")
    samples = scrape_url(server.metrics_url)
    coalesced = value(samples, "inferd_cache_coalesced_total", model="held")
    assert coalesced - value(metric_before, "inferd_cache_coalesced_total", model="held") == 7
    hits = value(samples, "inferd_cache_hits_total", tier="local", model="held")
    assert hits == _count(after, "cache_hit")  # the statistics' hits are the tier's


# -- normalisation ---------------------------------------------------------------------------


def test_float_decimals_round_inputs_before_keying_and_are_off_by_default(client: Client) -> None:
    base = 10.0 if client.protocol == "http" else 20.0
    first, first_exec = _infer(client, "rounded", [base + 0.001, 1.0])
    second, second_exec = _infer(client, "rounded", [base + 0.004, 1.0])  # 2 decimals: equal
    assert second_exec == first_exec
    np.testing.assert_array_equal(second, first)  # the cached answer, made from base + 0.001
    _, third_exec = _infer(client, "rounded", [base + 0.01, 1.0])  # differs at 2 decimals
    assert third_exec != first_exec
    _, a = _infer(client, "cached", [base + 0.001, 1.0])  # no cache_float_decimals
    _, b = _infer(client, "cached", [base + 0.004, 1.0])
    assert a != b


def test_text_normalize_strips_lowers_and_composes_and_is_off_by_default(client: Client) -> None:
    word = "Caf\u00e9" if client.protocol == "http" else "Th\u00e9"
    decomposed = unicodedata.normalize("NFD", word)
    first, first_exec = _texts(client, "texts", [f"  {word} "])
    assert first == [f"  {word} ".encode()]  # the model ran on the text as sent
    for variant in (word.lower(), decomposed, f"\t{decomposed.upper()}\n"):
        _, exec_id = _texts(client, "texts", [variant])
        assert exec_id == first_exec, variant
    _, other = _texts(client, "texts", [word + "s"])
    assert other != first_exec
    _, a = _texts(client, "raw_texts", [word])
    _, b = _texts(client, "raw_texts", [word.lower()])
    _, c = _texts(client, "raw_texts", [decomposed])
    assert len({a, b, c}) == 3


# -- what is not cached ----------------------------------------------------------------------


def test_an_answer_over_cache_max_response_bytes_is_not_cached(client: Client) -> None:
    values = [float(i) for i in range(256)]  # 1 KiB of OUT alone: over 512 bytes
    _, first = _infer(client, "small", values)
    _, second = _infer(client, "small", values)
    assert second != first
    _, small_first = _infer(client, "small", [1.0])
    _, small_second = _infer(client, "small", [1.0])
    assert small_second == small_first


def test_cache_max_entries_bounds_a_models_entries(client: Client) -> None:
    base = 100.0 if client.protocol == "http" else 200.0
    _, first = _infer(client, "bounded", [base])
    assert _infer(client, "bounded", [base])[1] == first  # cached
    _infer(client, "bounded", [base + 1])
    _infer(client, "bounded", [base + 2])  # a third entry: the least recently used goes
    assert _infer(client, "bounded", [base])[1] != first  # executed again


def test_cache_ttl_seconds_expires_an_answer(client: Client) -> None:
    values = [7.25] if client.protocol == "http" else [8.25]
    _, first = _infer(client, "brief", values)
    deadline = time.monotonic() + 30
    while (latest := _infer(client, "brief", values)[1]) == first:  # hits until it expires
        assert time.monotonic() < deadline, "the entry never expired"
    assert latest > first


# -- metrics ---------------------------------------------------------------------------------


def test_metrics_count_hits_and_misses_per_tier_and_under_tritons_names(
    server: RunningServer,
) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [99.0]}]}
        for _ in range(3):
            assert c.post("/v2/models/cached/infer", json=body).status_code == 200
    entry = stats(server, "cached")
    samples = scrape_url(server.metrics_url)
    hits = value(samples, "inferd_cache_hits_total", tier="local", model="cached")
    misses = value(samples, "inferd_cache_misses_total", tier="local", model="cached")
    assert hits >= 2 and misses >= 1
    assert value(samples, "inferd_cache_entries", tier="local") >= 1
    assert value(samples, "inferd_cache_bytes", tier="local") > 0
    assert value(samples, "inferd_cache_lookup_seconds_count", tier="local") >= hits + misses
    assert value(samples, "inferd_cache_insert_seconds_count", tier="local") >= 1
    # Triton's names read the statistics API's numbers: the two agree.
    labels = {"model": "cached", "version": "1"}
    # (The parser reads Triton's bare-named counters with a _total suffix.)
    hit = _count(entry, "cache_hit")
    assert value(samples, "nv_cache_num_hits_per_model_total", **labels) == hit
    miss = _count(entry, "cache_miss")
    assert value(samples, "nv_cache_num_misses_per_model_total", **labels) == miss
    assert ("nv_cache_hit_duration_per_model_total", frozenset(labels.items())) in samples
    assert ("nv_cache_miss_duration_per_model_total", frozenset(labels.items())) in samples
    plain = frozenset({"model": "plain", "version": "1"}.items())
    assert ("nv_cache_num_hits_per_model_total", plain) not in samples  # its model: no cache


def test_eviction_by_bytes_is_visible_in_metrics(tmp_path: Path) -> None:
    write_exec_model(tmp_path, "cached")
    size = 8192
    with run_server(tmp_path, cache=parse_cache_config([f"local,size={size}"])) as running:
        with httpx.Client(base_url=running.url, timeout=10) as c:
            for i in range(40):  # 40 distinct answers of 256 bytes of OUT each
                data = [float(i)] * 64
                body = {
                    "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 64], "data": data}]
                }
                assert c.post("/v2/models/cached/infer", json=body).status_code == 200
        samples = scrape_url(running.metrics_url)
    assert value(samples, "inferd_cache_evictions_total", tier="local") > 0
    assert 0 < value(samples, "inferd_cache_bytes", tier="local") <= size
    assert value(samples, "inferd_cache_inserts_total", tier="local") == 40


# -- versions --------------------------------------------------------------------------------


def test_a_version_swap_never_serves_the_old_versions_answers(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_exec_model(repo, "swap", bump=0.0)
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    settings = parse_cache_config(["local,size=1M"])
    with (
        run_server(repo, cache=settings, model_control_mode="explicit", load_models=("*",)) as s,
        httpx.Client(base_url=s.url, timeout=30) as c,
    ):

        def answer() -> tuple[float, str]:
            doc = c.post("/v2/models/swap/infer", json=body).json()
            return doc["outputs"][0]["data"][0], doc["model_version"]

        assert answer() == answer() == (1.0, "1")  # cached
        # A new version: the default moves to it, and the key holds the version.
        write_exec_model(repo, "swap", bump=100.0, version="2")
        assert c.post("/v2/repository/models/swap/load").status_code == 200
        assert answer() == (101.0, "2")
        # The same version number reloaded from new files: its checksum is in the key.
        shutil.rmtree(repo / "swap" / "1")
        write_exec_model(repo, "swap", bump=200.0, version="2")
        assert c.post("/v2/repository/models/swap/load").status_code == 200
        assert answer() == (201.0, "2")


# -- a model enabling the cache on a server without one ------------------------------------


def test_a_cached_model_on_a_server_without_a_cache_serves_uncached_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_exec_model(tmp_path, "cached")
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    with (
        caplog.at_level(logging.WARNING, logger="inferd.repository"),
        run_server(tmp_path) as running,
        httpx.Client(base_url=running.url, timeout=10) as c,
    ):
        execs = [c.post("/v2/models/cached/infer", json=body).json() for _ in range(2)]
    assert execs[0]["outputs"][1]["data"] != execs[1]["outputs"][1]["data"]
    warned = [r.getMessage() for r in caplog.records if "response_cache" in r.getMessage()]
    assert warned and "cached" in warned[0] and "--cache-config" in warned[0]


def test_an_ensemble_never_serves_answers_of_a_steps_old_version(tmp_path: Path) -> None:
    """An ensemble's answers depend on its steps' models: a new version of one is a new key."""
    repo = tmp_path / "models"
    write_exec_model(repo, "step_model", cached=False, bump=0.0)
    steps = [step("step_model", {"IN": "IN"}, {"OUT": "OUT"})]
    write_ensemble(repo, "flow", ensemble_config("flow", steps, 64, extra=CACHED))
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    settings = parse_cache_config(["local,size=1M"])
    with (
        run_server(repo, cache=settings, model_control_mode="explicit", load_models=("*",)) as s,
        httpx.Client(base_url=s.url, timeout=30) as c,
    ):

        def answer() -> float:
            r = c.post("/v2/models/flow/infer", json=body)
            assert r.status_code == 200, r.text
            return float(r.json()["outputs"][0]["data"][0])

        assert answer() == answer() == 1.0
        assert _count(stats(s, "flow"), "cache_hit") == 1
        write_exec_model(repo, "step_model", cached=False, bump=100.0, version="2")
        assert c.post("/v2/repository/models/step_model/load").status_code == 200
        assert answer() == 101.0  # the step's new version answers, not the old entry
        assert answer() == 101.0  # and is cached in turn
        assert _count(stats(s, "flow"), "cache_hit") == 2


def test_a_waiter_is_not_failed_by_the_deadline_of_the_request_it_waited_on(
    tmp_path: Path,
) -> None:
    """Identical requests share one execution, but not the leader's own deadline: a request
    that waited on one failed for its queue timeout runs itself and answers."""
    repo = tmp_path / "models"
    write_exec_model(repo, "slow", delay_ms=600)  # one instance: a second request queues
    config = repo / "slow" / "config.pbtxt"
    policy = "dynamic_batching { default_queue_policy { allow_timeout_override: true } }"
    config.write_text(config.read_text().replace("dynamic_batching { }", policy))

    def body(*values: float, **parameters: Any) -> dict[str, Any]:
        shape = [1, len(values)]
        inputs = [{"name": "IN", "datatype": "FP32", "shape": shape, "data": list(values)}]
        return {"inputs": inputs, "parameters": parameters}

    async def scenario(server: RunningServer) -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:

            async def until(inflight: int, queued: int) -> None:
                deadline = time.monotonic() + 10
                while await asyncio.to_thread(_gauges, server, "slow") != (inflight, queued):
                    assert time.monotonic() < deadline, (
                        f"never {inflight}, {queued} queued: {_gauges(server, 'slow')}"
                    )
                    await asyncio.sleep(0.002)

            # Two values a row: never batched with the leader's one, so it runs first, alone.
            blocker = asyncio.create_task(c.post("/v2/models/slow/infer", json=body(1.0, 2.0)))
            await until(1, 0)  # executing for 600 ms (scrapes take tens of ms here)
            # The leader may wait 300 ms (Triton's `timeout`, µs): it fails, queued behind it.
            leader = asyncio.create_task(
                c.post("/v2/models/slow/infer", json=body(4242.0, timeout=300_000))
            )
            await until(2, 1)
            waiter = await c.post("/v2/models/slow/infer", json=body(4242.0))
            await blocker
            return await leader, waiter

    with run_server(repo, cache=parse_cache_config(["local,size=1M"])) as server:
        leader, waiter = asyncio.run(scenario(server))
    # Refused as unmeetable once the blocker's run has been timed, or expired in the queue.
    assert leader.status_code in (400, 504) and "deadline" in leader.text, leader.text
    assert waiter.status_code == 200, waiter.text
    assert waiter.json()["outputs"][0]["data"] == [4242.0]


def _gauges(server: RunningServer, model: str) -> tuple[float, float]:
    """The model's requests in flight and in its queue, from the server's metrics."""
    samples = scrape_url(server.metrics_url)

    def total(metric: str) -> float:
        return sum(
            v
            for (name, labels), v in samples.items()
            if name == metric and ("model", model) in labels
        )

    return total("inferd_inflight_requests"), total("inferd_queue_depth")


def _inflight(server: RunningServer, model: str) -> float:
    samples = scrape_url(server.metrics_url)
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "inferd_inflight_requests" and ("model", model) in labels
    )
