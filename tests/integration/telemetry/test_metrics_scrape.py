"""/metrics never fails: scrapes race with request recording and must all answer 200.

Issue #13: under load, a scrape iterating the health window while the event loop appended
to it answered 500 (`deque mutated during iteration`). Here clients load two models over
both protocols for the whole time a scraper scrapes, and every scrape must be a 200 that
Prometheus' own parser reads, with the series of both models in it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import RunningServer, run_server

SCRAPES = 150
# (protocol, model) of each load client: two models, both protocols.
LOADS = [("http", "mlp"), ("grpc", "mlp"), ("http", "counter"), ("grpc", "counter")]


@pytest.fixture(scope="module")
def loaded(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, metrics_triton_names=True) as running:
        yield running


def _infer_once(running: RunningServer, protocol: str, model: str) -> Callable[[], None]:
    """One client, as a function that sends one request and checks its answer."""
    mod = httpclient if protocol == "http" else grpcclient
    address = running.url.removeprefix("http://") if protocol == "http" else running.grpc_address
    client = mod.InferenceServerClient(address)
    name, width = ("input", 8) if model == "mlp" else ("IN", 2)
    inp = mod.InferInput(name, [1, width], "FP32")
    inp.set_data_from_numpy(np.ones((1, width), np.float32))

    def once() -> None:
        result = client.infer(model, [inp])
        assert result.as_numpy("probabilities" if model == "mlp" else "OUT") is not None

    return once


def _success(text: str, model: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "inferd_request_success":
            return sum(s.value for s in family.samples if s.labels["model"] == model)
    return 0.0


@pytest.fixture
def eager_thread_switches() -> Iterator[None]:
    """Switch threads every few microseconds instead of every 5 ms: a collector iterating
    shared state from the scrape thread then meets the event loop's writes within a few
    scrapes, as it did under real load, instead of once in a long while."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("eager_thread_switches")
def test_every_scrape_under_load_is_a_200_that_parses(loaded: RunningServer) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []
    sent = [0] * len(LOADS)

    def load(index: int, protocol: str, model: str) -> None:
        try:
            once = _infer_once(loaded, protocol, model)
            while not stop.is_set():
                once()
                sent[index] += 1
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=load, args=(i, p, m), daemon=True) for i, (p, m) in enumerate(LOADS)
    ]
    for t in threads:
        t.start()
    failed: list[str] = []
    texts: list[str] = []
    try:
        with httpx.Client(timeout=30) as scraper:
            for _ in range(SCRAPES):
                if stop.is_set():
                    break
                response = scraper.get(loaded.metrics_url)
                if response.status_code != 200:
                    failed.append(f"{response.status_code}: {response.text[:300]}")
                    continue
                families = {f.name for f in text_string_to_metric_families(response.text)}
                assert {"inferd_health_score", "nv_inference_request_success"} <= families
                texts.append(response.text)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, f"a load client failed: {errors[0]!r}"
    assert not failed, f"{len(failed)} of {SCRAPES} scrapes failed; the first: {failed[0]}"
    assert len(texts) == SCRAPES
    assert all(sent), f"every client sent requests: {sent}"
    # The scrapes really raced with requests: both models served between the first and
    # the last scrape.
    for model in ("mlp", "counter"):
        assert _success(texts[-1], model) > _success(texts[0], model), model
