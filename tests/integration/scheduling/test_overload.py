"""10x the sustainable concurrency against a real server process: stays up, bounded memory,
exactly one answer per request (a success or a fast refusal), accepted requests in time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.support.admission_models import body
from tests.support.fault_models import RECORDING_PY, param, write_model
from tests.support.metrics_scrape import scrape_url, value
from tests.support.process_memory import rss_kib
from tests.support.servers import free_port, run_cli_server

# The model runs a batch of up to 4 in ~20 ms: about 4 requests at a time is what it sustains.
SUSTAINABLE = 4
CLIENTS = 10 * SUSTAINABLE
DURATION_S = 4.0
DEADLINE_MS = 250


async def _client(
    client: httpx.AsyncClient, stop_at: float, results: list[tuple[int, float]]
) -> None:
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        started = time.monotonic()
        r = await client.post(
            "/v2/models/busy/infer",
            json=body(1 + i % 7),
            headers={"inferd-timeout-ms": str(DEADLINE_MS)},
        )
        results.append((r.status_code, time.monotonic() - started))
        if r.status_code == 429:
            # A well-behaved client honours Retry-After (clients that hammer a shedding
            # server measure their own event loop's backlog, not the server's answers).
            await asyncio.sleep(float(r.headers["Retry-After"]))


def test_ten_times_the_sustainable_load(tmp_path: Path) -> None:
    write_model(
        tmp_path / "models",
        "busy",
        RECORDING_PY,
        param("delay_ms", 20) + "dynamic_batching { default_queue_policy { max_queue_size: 16 } }",
        max_batch_size=4,
    )
    metrics_port = free_port()
    args = ("--grpc-port", "0", "--metrics-port", str(metrics_port), "--log-level", "ERROR")
    with run_cli_server(tmp_path / "models", tmp_path / "server.log", *args) as server:
        url = server.url
        baseline = rss_kib(server.proc.pid)
        results: list[tuple[int, float]] = []

        async def run() -> None:
            # One client, CLIENTS connections: building a client per connection would stall
            # the test's own loop for a second (each builds an SSL context).
            limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
                stop_at = time.monotonic() + DURATION_S
                await asyncio.gather(*(_client(client, stop_at, results) for _ in range(CLIENTS)))

        asyncio.run(run())
        after = rss_kib(server.proc.pid)
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        metrics = scrape_url(f"http://127.0.0.1:{metrics_port}/metrics")
        server.stop()
    statuses = Counter(status for status, _ in results)
    # Every request got exactly one answer: a success, a shed (429) or, rarely, a deadline.
    assert set(statuses) <= {200, 429, 504}, statuses
    assert statuses[200] > 0 and statuses[429] > 0, statuses
    assert statuses[504] <= 0.02 * len(results), statuses
    # Accepted requests met their deadline, on the server's clock (from the request's
    # arrival to its answer): every success is in the histogram's 0.5 s bucket. (The test
    # client's own clock adds its event loop's backlog on these two shared cores.)
    labels = {"model": "busy", "version": "1"}
    successes = value(metrics, "inferd_request_duration_seconds_count", **labels)
    within = value(metrics, "inferd_request_duration_seconds_bucket", **labels, le="0.5")
    assert successes == statuses[200]
    assert within == successes, f"{successes - within} successes took over 0.5 s"
    assert after < baseline + 100 * 1024, f"RSS grew from {baseline} KiB to {after} KiB"
