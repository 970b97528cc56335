"""`--capture-redis`: captures in a real Redis stream (127.0.0.1:6379), capped at MAXLEN,
loaded back equal to what was sent; a Redis that cannot be reached drops and counts them
while every request succeeds; bad options fail at start naming the option."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from inferd.cli.capture_options import add_capture_options, capture_settings
from inferd.monitoring.capture_redis import load_redis_capture
from inferd.monitoring.capture_settings import CaptureOptionError, CaptureSettings
from tests.support.capture_clients import WIRES, Client
from tests.support.metrics_scrape import scrape, value
from tests.support.monitoring_models import parameters, write_signed_model
from tests.support.servers import free_port, run_server

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def stream() -> Iterator[str]:
    """A stream key of this test's own (the Redis is shared), removed afterwards."""
    key = f"inferd-test:capture:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"the tests need Redis at {REDIS_URL}: {exc}")
    yield key
    client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("capture_redis_repo")
    write_signed_model(repo, "all", extra=parameters(capture_sample_rate=1))
    return repo


def test_the_stream_holds_the_newest_captures_equal_to_what_was_sent(
    repo: Path, stream: str
) -> None:
    settings = CaptureSettings(redis_url=REDIS_URL, redis_stream=stream, redis_maxlen=5)
    rng = np.random.default_rng(5)
    sent = []
    with run_server(repo, capture=settings) as running:
        for wire in WIRES:
            with Client(wire, running) as client:
                for i in range(3):
                    x = rng.normal(size=(1 + i, 4)).astype(np.float32)
                    sent.append((x, client.infer("all", x, f"{wire}-{i}")))
        assert running.server.capture.flush()
    store = redis.Redis.from_url(REDIS_URL)
    assert store.xlen(stream) == 5  # MAXLEN: the oldest 4 of 9 are gone
    rows = load_redis_capture(store, stream)
    store.close()
    assert [r.id for r in rows] == [answer.id for _, answer in sent[-5:]]
    for row, (x, answer) in zip(rows, sent[-5:], strict=True):
        assert (row.model, row.version) == ("all", "1")
        np.testing.assert_array_equal(row.inputs["x"], x)
        np.testing.assert_array_equal(row.outputs["y"], answer.y)
        np.testing.assert_array_equal(row.outputs["cls"], answer.cls)
        assert len(row.fingerprint) == 16


def test_an_unreachable_redis_drops_and_counts_and_requests_succeed(repo: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = CaptureSettings(redis_url=url, redis_stream="inferd-test:nowhere")
    with run_server(repo, capture=settings) as running:
        with Client("grpc", running) as client:
            for i in range(6):
                answer = client.infer("all", np.full((1, 4), i, np.float32))
                assert answer.id, "captured: it carries its id"
        assert running.server.capture.flush()
        samples = scrape(running)
    assert value(samples, "inferd_capture_dropped_total", model="all", reason="redis_error") == 6


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--capture-redis", "http://127.0.0.1:6379"], ["--capture-redis", "redis://"]),
        (["--capture-redis", REDIS_URL, "--capture-redis-maxlen", "0"], ["--capture-redis-maxlen"]),
    ],
)
def test_bad_redis_options_fail_naming_the_option(argv: list[str], words: list[str]) -> None:
    parser = argparse.ArgumentParser()
    add_capture_options(parser)
    with pytest.raises(CaptureOptionError) as caught:
        capture_settings(parser.parse_args(argv))
    for word in words:
        assert word in str(caught.value)
