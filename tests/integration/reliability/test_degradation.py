"""Degradation tiers end to end (docs/reliability.md#degradation-tiers): a Python model whose
latency the test sets while the server runs, over HTTP and gRPC (tritonclient, one case
table): traffic moves to the fallback once the p99 passes the threshold, every request
answered in time; it returns after the dwell time; latency hovering at the threshold does
not flap; stale cache answers only for a cached model; a request that opts out is never
degraded; a tier's queue bound and open circuit refuse; the last tier rolls a slow canary
or a fresh promote back; metrics, statistics and the response say which tier answered."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.cache.cache_settings import parse_cache_config
from tests.support.degrade_models import (
    FALLBACK_OFFSET,
    PRIMARY_OFFSET,
    Delays,
    degrade,
    param,
    write_timed_model,
)
from tests.support.metrics_scrape import scrape_url, value
from tests.support.servers import RunningServer, run_cli_server, run_server

PROTOCOLS = ["http", "grpc"]
DEADLINE_S = 3.0  # every request's own deadline: "answered in time" is answered within it
FAST = {"window_s": "2", "min_requests": "5", "dwell_s": "1", "probe_interval_ms": "200"}
LIGHT = param("fallback_model", "light")
CACHED = "response_cache { enable: true }\n" + param("cache_ttl_seconds", "0.3")
WEIGHTS = param("canary_weights", '{\\"1\\": 50, \\"2\\": 50}')
BOTH = "version_policy: { all { } }\n"  # versions 1 and 2 loaded


def models(repo: Path) -> dict[str, Delays]:
    delays = {"light": write_timed_model(repo, "light", FALLBACK_OFFSET)}
    for p in PROTOCOLS:
        delays[f"moving_{p}"] = write_timed_model(
            repo, f"moving_{p}", PRIMARY_OFFSET, degrade("150: fallback", **FAST) + LIGHT
        )
        delays[f"cached_{p}"] = write_timed_model(
            repo,
            f"cached_{p}",
            PRIMARY_OFFSET,
            degrade("150: stale fallback", stale_s="60", **FAST) + LIGHT + CACHED,
        )
        delays[f"queued_{p}"] = write_timed_model(
            repo, f"queued_{p}", PRIMARY_OFFSET, degrade("150: queue=1", **FAST)
        )
        delays[f"deadline_{p}"] = write_timed_model(
            repo, f"deadline_{p}", PRIMARY_OFFSET, degrade("150: fallback", **FAST) + LIGHT
        )
        delays[f"circuit_{p}"] = write_timed_model(
            repo, f"circuit_{p}", PRIMARY_OFFSET, degrade("150: open_circuit", **FAST)
        )
    hover = {**FAST, "dwell_s": "0.5"}
    delays["hover"] = write_timed_model(
        repo, "hover", PRIMARY_OFFSET, degrade("150: fallback=50%", **hover) + LIGHT
    )
    delays["canaried"] = write_timed_model(
        repo,
        "canaried",
        PRIMARY_OFFSET,
        BOTH + degrade("150: rollback", **FAST) + "\n" + WEIGHTS,
        versions=(1, 2),
    )
    delays["promoted"] = write_timed_model(
        repo, "promoted", PRIMARY_OFFSET, BOTH + degrade("150: rollback", **FAST), versions=(1, 2)
    )
    return delays


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, dict[str, Delays]]]:
    repo = tmp_path_factory.mktemp("degrade") / "repo"
    repo.mkdir()
    delays = models(repo)
    cache = parse_cache_config(["local,size=1M"])
    with run_server(repo, cache=cache, admin_api=True) as s:
        yield s, delays


@pytest.fixture
def server(setup: tuple[RunningServer, dict[str, Delays]]) -> RunningServer:
    return setup[0]


@pytest.fixture
def delays(setup: tuple[RunningServer, dict[str, Delays]]) -> dict[str, Delays]:
    return setup[1]


@dataclass
class Reply:
    status: str  # "200" / "OK", or the error's status
    model_name: str = ""
    out: list[float] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def tier(self) -> int:
        return int(self.parameters.get("degradation_tier", 0))


class Client:
    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        address = f"127.0.0.1:{server.port}" if protocol == "http" else server.grpc_address
        self.raw = self.mod.InferenceServerClient(address)

    def infer(
        self, model: str, x: float, deadline_s: float = DEADLINE_S, **parameters: Any
    ) -> Reply:
        inp = self.mod.InferInput("IN", [1, 2], "FP32")
        inp.set_data_from_numpy(np.full((1, 2), x, np.float32))
        kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
        if self.protocol == "http":
            kwargs["headers"] = {"inferd-timeout-ms": str(int(deadline_s * 1000))}
        else:
            kwargs["client_timeout"] = deadline_s
        try:
            result = self.raw.infer(model, [inp], **kwargs)
        except InferenceServerException as exc:
            return Reply(str(exc.status()).removeprefix("StatusCode."), message=exc.message())
        response = result.get_response()
        if self.protocol == "http":
            status, name, params = "200", response["model_name"], response.get("parameters", {})
        else:
            status, name = "OK", response.model_name
            params = {
                k: getattr(v, v.WhichOneof("parameter_choice"))
                for k, v in response.parameters.items()
            }
        return Reply(status, name, result.as_numpy("OUT").ravel().tolist(), params)


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


OK = {"http": "200", "grpc": "OK"}
SHED = {"http": "429", "grpc": "RESOURCE_EXHAUSTED"}
UNAVAILABLE = {"http": "503", "grpc": "UNAVAILABLE"}
BAD = {"http": "400", "grpc": "INVALID_ARGUMENT"}


def degradation(server: RunningServer, model: str) -> dict[str, Any]:
    """The model's statistics' `degradation` field (inferd's own, over HTTP)."""
    doc = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=10).json()
    found: dict[str, Any] = doc["model_stats"][0]["degradation"]
    return found


def until(condition: Callable[[], bool], send: Callable[[], object], within_s: float = 30) -> int:
    """Send requests until `condition` holds (bounded); how many it took."""
    deadline = time.monotonic() + within_s
    sent = 0
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s ({sent} requests)"
        send()
        sent += 1
    return sent


def primary_answer(model: str, x: float, reply: Reply) -> bool:
    return reply.model_name == model and reply.out == [x + PRIMARY_OFFSET] * 2 and not reply.tier


def fallback_answer(model: str, x: float, reply: Reply, action: str = "fallback") -> bool:
    return (
        reply.model_name == "light"
        and reply.out == [x + FALLBACK_OFFSET] * 2
        and reply.parameters.get("fallback_from") == model
        and reply.parameters.get("degradation_action") == action
        and reply.parameters.get("degradation_model") == "light"
        and reply.tier == 1
    )


# -- into a tier and back -------------------------------------------------------------------


def test_a_slow_model_moves_to_its_fallback_and_returns_after_the_dwell(
    server: RunningServer, delays: dict[str, Delays], client: Client
) -> None:
    model = f"moving_{client.protocol}"
    for i in range(20):  # fast: the model itself answers, undegraded
        assert primary_answer(model, i, client.infer(model, i))
    delays[model].set("300")  # three times... ten: well past the 150 ms threshold
    replies: list[Reply] = []
    until(
        lambda: any(r.model_name == "light" for r in replies),
        lambda: replies.append(client.infer(model, 1.0)),
    )
    entered = time.monotonic()
    # Within the window: the first slow requests moved it, no more than min_requests.
    assert len(replies) <= 5
    for _ in range(60):
        replies.append(client.infer(model, 1.0))
    assert all(r.status == OK[client.protocol] for r in replies)  # every one in time
    moved = [r for r in replies if r.model_name == "light"]
    assert all(fallback_answer(model, 1.0, r) for r in moved)
    assert len(moved) > len(replies) // 2  # probes aside, the fallback answers
    assert all(primary_answer(model, 1.0, r) for r in replies if r.model_name != "light")
    # A request that opts out waits for the model itself.
    opted = client.infer(model, 2.0, inferd_degrade=False)
    assert primary_answer(model, 2.0, opted)
    bad = client.infer(model, 2.0, inferd_degrade="no")
    assert bad.status == BAD[client.protocol] and "inferd_degrade" in bad.message
    # Seen from outside: the metrics and the statistics name the tier.
    samples = scrape_url(server.metrics_url)
    assert value(samples, "inferd_degradation_tier", model=model) == 1
    fallbacks = value(
        samples, "inferd_degraded_requests_total", model=model, tier="1", action="fallback"
    )
    assert fallbacks >= len(moved)
    stats = degradation(server, model)
    assert stats["tier"] == 1 and stats["p99_ms"] > 150
    assert stats["requests"]["1"]["fallback"] >= len(moved)
    # Fast again: the probes show it; it returns once the window is clean and the dwell
    # time has passed, and then the model answers everything itself.
    delays[model].set("0")
    until(lambda: degradation(server, model)["tier"] == 0, lambda: client.infer(model, 3.0))
    assert time.monotonic() - entered >= 1.0  # degrade_dwell_s
    assert all(primary_answer(model, 4.0, client.infer(model, 4.0)) for _ in range(20))
    assert degradation(server, model)["tier_changes"] == 2  # in once, out once


def test_clients_whose_deadlines_the_slow_model_misses_move_it_too(
    server: RunningServer, delays: dict[str, Delays], client: Client
) -> None:
    """Deadlines (100 ms) shorter than the threshold (150 ms): the slow model's requests time
    out or are refused as unmeetable, never answered slowly, and still move it to the
    fallback, whose answers come in time."""
    model = f"deadline_{client.protocol}"
    for i in range(10):
        assert primary_answer(model, i, client.infer(model, i, deadline_s=0.1))
    delays[model].set("300")
    replies: list[Reply] = []
    until(
        lambda: any(r.model_name == "light" for r in replies),
        lambda: replies.append(client.infer(model, 1.0, deadline_s=0.1)),
    )
    failed = {r.status for r in replies if r.status != OK[client.protocol]}
    assert failed  # what the client saw before the move: timeouts or refusals
    after = [client.infer(model, 1.0, deadline_s=0.1) for _ in range(20)]
    assert sum(fallback_answer(model, 1.0, r) for r in after) >= 10
    delays[model].set("0")


def test_latency_hovering_at_the_threshold_enters_once_and_does_not_flap(
    server: RunningServer, delays: dict[str, Delays]
) -> None:
    """Blocks longer than the window, alternately just past (160 ms) and just under (130 ms)
    the 150 ms threshold: the p99 crosses it both ways, but never under the release point
    (120 ms), so the model enters the tier once and stays."""
    c = Client("http", server)
    delays["hover"].set("160")
    until(lambda: degradation(server, "hover")["tier"] == 1, lambda: c.infer("hover", 1.0))
    replies: list[Reply] = []
    p99s = []
    for block in range(4):
        delays["hover"].set("130" if block % 2 == 0 else "160")
        started = time.monotonic()
        while time.monotonic() - started < 2.5:  # past the 2 s window: it holds only this block
            replies.append(c.infer("hover", 1.0))
        p99s.append(degradation(server, "hover")["p99_ms"])
    assert all(r.status == "200" for r in replies)
    assert min(p99s) < 150 < max(p99s)  # the p99 did cross the threshold both ways
    assert degradation(server, "hover")["tier_changes"] == 1
    assert degradation(server, "hover")["tier"] == 1
    moved = sum(r.model_name == "light" for r in replies)
    assert abs(moved - len(replies) / 2) <= 1  # fallback=50%: every other request
    delays["hover"].set("0")


# -- stale answers ---------------------------------------------------------------------------


def test_a_degraded_cached_model_answers_from_entries_past_their_ttl(
    server: RunningServer, delays: dict[str, Delays], client: Client
) -> None:
    model = f"cached_{client.protocol}"
    assert primary_answer(model, 7.0, client.infer(model, 7.0))  # cached now, 0.3 s TTL
    stored = time.monotonic()
    delays[model].set("300")
    n = iter(range(100, 10_000))
    until(
        lambda: degradation(server, model)["tier"] == 1 and time.monotonic() - stored > 0.3,
        lambda: client.infer(model, float(next(n))),
    )
    # A malformed request is refused as ever, though its inputs match an entry (sent as JSON:
    # tritonclient itself refuses a `priority` that is not a number).
    body = {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [7.0, 7.0]}],
        "parameters": {"priority": "high"},
    }
    bad = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=10)
    assert bad.status_code == 400 and "priority" in bad.json()["error"]
    stale = client.infer(model, 7.0)  # past its TTL: the model's own earlier answer
    assert stale.model_name == model and stale.out == [8.0, 8.0]
    assert stale.parameters["degradation_action"] == "stale" and stale.tier == 1
    assert stale.parameters["degradation_model"] == model
    # Inputs the cache never saw go to the fallback (or, one at a time, as a probe).
    fresh = [(50.5 + i, client.infer(model, 50.5 + i)) for i in range(5)]
    assert any(fallback_answer(model, x, r) for x, r in fresh)
    assert all(fallback_answer(model, x, r) or primary_answer(model, x, r) for x, r in fresh)
    # Opted out: never a stale answer; the model runs (slowly) and answers fresh.
    assert primary_answer(model, 7.0, client.infer(model, 7.0, inferd_degrade=False))
    samples = scrape_url(server.metrics_url)
    stale_count = value(
        samples, "inferd_degraded_requests_total", model=model, tier="1", action="stale"
    )
    assert stale_count >= 1
    delays[model].set("0")


def test_stale_answers_need_the_cache_on(tmp_path: Path) -> None:
    """The same model on a server without --cache-config: its answers are never stale ones
    (the config asks for the cache, the server has none: served uncached, as Triton)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_timed_model(repo, "light", FALLBACK_OFFSET)
    delays = write_timed_model(
        repo, "cached", PRIMARY_OFFSET, degrade("150: stale fallback", **FAST) + LIGHT + CACHED
    )
    with run_server(repo) as running:
        c = Client("http", running)
        assert primary_answer("cached", 7.0, c.infer("cached", 7.0))
        delays.set("300")
        replies: list[Reply] = []
        until(
            lambda: degradation(running, "cached")["tier"] == 1,
            lambda: replies.append(c.infer("cached", 7.0)),
        )
        replies += [c.infer("cached", 7.0) for _ in range(10)]
        assert not [r for r in replies if r.parameters.get("degradation_action") == "stale"]
        assert any(fallback_answer("cached", 7.0, r) for r in replies)


# -- refusing --------------------------------------------------------------------------------


def test_a_tiers_queue_bound_refuses_the_excess_at_once(
    server: RunningServer, delays: dict[str, Delays], client: Client
) -> None:
    model = f"queued_{client.protocol}"
    delays[model].set("200")
    until(lambda: degradation(server, model)["tier"] == 1, lambda: client.infer(model, 1.0))
    import concurrent.futures

    clients = [Client(client.protocol, server) for _ in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda c: c.infer(model, 1.0), clients))
    for c in clients:
        c.raw.close()
    shed = [r for r in replies if r.status == SHED[client.protocol]]
    served = [r for r in replies if r.status == OK[client.protocol]]
    assert shed and served and len(shed) + len(served) == 8
    assert all("tier 1" in r.message and "queue to 1 requests" in r.message for r in shed)
    assert degradation(server, model)["requests"]["1"]["refused"] >= len(shed)
    delays[model].set("0")


def test_a_tier_holding_the_circuit_open_refuses_and_probes_until_it_recovers(
    server: RunningServer, delays: dict[str, Delays], client: Client
) -> None:
    model = f"circuit_{client.protocol}"
    delays[model].set("300")
    until(lambda: degradation(server, model)["tier"] == 1, lambda: client.infer(model, 1.0))
    ready = httpx.get(f"{server.url}/v2/models/{model}/ready", timeout=10)
    assert ready.status_code != 200  # the circuit is open: the model is not ready
    replies = [client.infer(model, 1.0) for _ in range(30)]
    refused = [r for r in replies if r.status == UNAVAILABLE[client.protocol]]
    assert refused and all("tier 1 holds its circuit open" in r.message for r in refused)
    # Opted out: no fallback to go to, the model held out: refused too (or sent as a probe).
    opted = [client.infer(model, 1.0, inferd_degrade=False) for _ in range(5)]
    assert any(r.status == UNAVAILABLE[client.protocol] for r in opted)
    assert all(
        r.status == UNAVAILABLE[client.protocol] or primary_answer(model, 1.0, r) for r in opted
    )
    # Probes still reach the model, so it recovers when it is fast again.
    delays[model].set("0")
    until(lambda: degradation(server, model)["tier"] == 0, lambda: client.infer(model, 1.0))
    assert httpx.get(f"{server.url}/v2/models/{model}/ready", timeout=10).status_code == 200
    assert primary_answer(model, 5.0, client.infer(model, 5.0))


# -- rollback as the last tier ----------------------------------------------------------------


def test_the_last_tier_rolls_a_slow_canary_back_and_says_why(
    server: RunningServer, delays: dict[str, Delays], caplog: pytest.LogCaptureFixture
) -> None:
    c = Client("http", server)
    router = server.server.registry.models["canaried"].router
    assert dict(router.weights) == {"1": 50, "2": 50}
    delays["canaried"].set("300", "2")  # the canary is the slow one
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        until(lambda: router.weights.get("2") == 0, lambda: c.infer("canaried", 1.0))
    assert dict(router.weights) == {"1": 50, "2": 0}
    said = [
        r.getMessage() for r in caplog.records if "rolled canary version 2 back" in r.getMessage()
    ]
    assert said and "p99" in said[0] and "passed 150 ms" in said[0]
    delays["canaried"].set("0", "2")


def test_the_last_tier_undoes_a_fresh_promote_of_the_slow_version(
    server: RunningServer, delays: dict[str, Delays], caplog: pytest.LogCaptureFixture
) -> None:
    c = Client("http", server)
    router = server.server.registry.models["promoted"].router
    routing = f"{server.url}/v2/models/promoted/routing"
    assert httpx.post(routing, json={"weights": {"1": 100}}, timeout=10).status_code == 200
    # All traffic to version 2, which turns out slow.
    assert httpx.post(routing + "/promote", json={"version": "2"}, timeout=10).status_code == 200
    delays["promoted"].set("300", "2")
    with caplog.at_level(logging.WARNING, logger="inferd.degrade"):
        until(lambda: dict(router.weights) == {"1": 100}, lambda: c.infer("promoted", 1.0))
    said = [
        r.getMessage() for r in caplog.records if "undid the promote of version 2" in r.getMessage()
    ]
    assert said and "p99" in said[0]
    delays["promoted"].set("0", "2")


# -- one engine, many front ends --------------------------------------------------------------


def test_with_workers_and_an_engine_the_engine_degrades_for_every_front_end(
    tmp_path: Path,
) -> None:
    """`--workers 2 --engine`: the engine runs the request path, so it measures the model and
    moves the front ends' requests to the fallback (and checks these models' requests)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_timed_model(repo, "light", FALLBACK_OFFSET)
    slow = write_timed_model(
        repo, "moving", PRIMARY_OFFSET, degrade("150: fallback", **FAST) + LIGHT
    )
    log = tmp_path / "server.log"
    with (
        run_cli_server(repo, log, "--workers", "2", "--engine") as cli,
        httpx.Client(base_url=cli.url, timeout=10) as http,
    ):

        def infer(x: float) -> dict[str, Any]:
            body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [x, x]}]}
            response = http.post("/v2/models/moving/infer", json=body)
            assert response.status_code == 200, response.text
            doc: dict[str, Any] = response.json()
            return doc

        assert infer(1.0)["model_name"] == "moving"
        slow.set("300")
        answers: list[dict[str, Any]] = []
        until(
            lambda: any(a["model_name"] == "light" for a in answers),
            lambda: answers.append(infer(1.0)),
        )
        moved = answers[-1]
        assert moved["outputs"][0]["data"] == [1.0 + FALLBACK_OFFSET] * 2
        assert moved["parameters"]["degradation_tier"] == 1
        assert moved["parameters"]["fallback_from"] == "moving"
        # A bad request is still the model's 400 (the engine checks degraded models).
        bad = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 3], "data": [1] * 3}]}
        refused = http.post("/v2/models/moving/infer", json=bad)
        assert refused.status_code == 400 and "IN" in refused.json()["error"]
