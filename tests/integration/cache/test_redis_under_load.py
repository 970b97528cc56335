"""The shared Redis tier keeps sharing on a busy host, with its default settings (issue 34).

Two `inferd serve` processes share one redis-server (the test's own, on a free port), given
nothing but `--cache-config redis,host=...,port=...`. The host is kept busy: a CPU-burning
process per core, and concurrent requests to both servers over HTTP and gRPC. Each value one
server computes is asked of the other a few requests later. Before this test's fix (5 ms on
every call, one breaker for lookups and inserts, counting calls that failed together one by
one) the first stall opened the breaker: the servers stopped sharing for the whole load,
and right after it an answer computed on one was not a hit on the other. Here most values
asked in every phase of the load are hits, and after it, computed on one, a hit on the
other, which executes nothing for it.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.cache_models import write_exec_model
from tests.support.metrics_scrape import scrape_url, value
from tests.support.protocol_clients import PROTOCOLS
from tests.support.redis_servers import OwnRedis
from tests.support.server_process import free_port
from tests.support.servers import CliServer, run_cli_server

MODEL = "cached"
PHASES = 3
PAIRS = 40  # values computed per client thread and phase
LAG = 4  # a value is asked of the other server this many requests after it was computed
DEADLINE_S = 60.0


@dataclass
class Replica:
    name: str
    cli: CliServer
    grpc_port: int
    metrics_port: int

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return scrape_url(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def redis_hits(self) -> float:
        return value(self.samples(), "inferd_cache_hits_total", tier="redis", model=MODEL)

    def statistics(self) -> tuple[int, int]:
        """(cache hits, executions) of the model, from the statistics API."""
        r = httpx.get(f"{self.cli.url}/v2/models/{MODEL}/stats", timeout=30)
        stats = r.json()["model_stats"][0]
        return int(stats["inference_stats"]["cache_hit"]["count"]), int(stats["execution_count"])

    def redis_tier(self) -> str:
        """The Redis tier's non-zero counts and gauges, for a failure's message."""
        shown = {}
        for (name, labels), count in self.samples().items():
            histogram = name.endswith(("_bucket", "_sum", "_count", "_created"))
            if name.startswith("inferd_cache_") and ("tier", "redis") in labels and not histogram:
                rest = ",".join(v for k, v in sorted(labels) if k != "tier")
                shown[f"{name.removeprefix('inferd_cache_')}{{{rest}}}"] = count
        counts = ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items()) if v)
        return f"{self.name}: {counts}"


class Caller:
    """One client of one server over one protocol (tritonclient)."""

    def __init__(self, replica: Replica, protocol: str) -> None:
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        port = replica.cli.url.rsplit(":", 1)[1] if protocol == "http" else replica.grpc_port
        self.client = self.mod.InferenceServerClient(f"127.0.0.1:{port}")

    def ask(self, x: float) -> tuple[float, int]:
        """(the answer, the number of the execution that made it)."""
        inp = self.mod.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[x]], dtype=np.float32))
        result = self.client.infer(MODEL, [inp])
        return float(result.as_numpy("OUT")[0, 0]), int(result.as_numpy("EXEC")[0, 0])

    def close(self) -> None:
        self.client.close()


@contextmanager
def busy_cores() -> Iterator[None]:
    """A process spinning on each core, for as long as the block runs."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(timeout=30)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Replica, Replica, OwnRedis]]:
    repo = tmp_path / "repo"
    write_exec_model(repo, MODEL)
    server = OwnRedis()
    server.start()
    with ExitStack() as stack:
        stack.callback(server.kill)
        replicas = []
        for name in ("a", "b"):
            grpc_port, metrics_port = free_port(), free_port()
            cli = stack.enter_context(
                run_cli_server(
                    repo, tmp_path / f"{name}.log",
                    "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
                    "--cache-config", f"redis,host=127.0.0.1,port={server.port}",  # defaults
                )
            )  # fmt: skip
            replicas.append(Replica(name, cli, grpc_port, metrics_port))
        yield replicas[0], replicas[1], server


def share(source: Replica, target: Replica, protocol: str, base: int, errors: list[str]) -> None:
    """PAIRS fresh values computed on `source`, each asked of `target` LAG requests later."""
    first, then = Caller(source, protocol), Caller(target, protocol)
    try:
        values = [float(base + i) for i in range(PAIRS + LAG)]
        for i, x in enumerate(values):
            asked = [(first, x)] if i < PAIRS else []
            if i >= LAG:
                asked.append((then, values[i - LAG]))
            for caller, y in asked:
                answer, _ = caller.ask(y)
                if answer != y:
                    errors.append(f"{y} answered {answer}")
    except Exception as exc:  # the test fails on it, naming it
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        first.close()
        then.close()


def in_redis(server: OwnRedis, x: float) -> bool:
    """Whether Redis holds an entry whose key description holds the input `x`."""
    client = redis.Redis("127.0.0.1", server.port)
    try:
        needle = struct.pack(">Q", 4) + np.float32(x).tobytes()  # as keys.py writes it
        keys = list(client.scan_iter(count=1000))
        for start in range(0, len(keys), 500):
            if any(v and needle in v for v in client.mget(keys[start : start + 500])):
                return True
        return False
    finally:
        client.close()


# After the load: (computed on, asked of, over)
AFTER = [(source, target, protocol) for source, target in (("a", "b"), ("b", "a"))
         for protocol in PROTOCOLS]  # fmt: skip


def test_two_servers_keep_sharing_through_redis_on_a_busy_host(
    pair: tuple[Replica, Replica, OwnRedis],
) -> None:
    a, b, server = pair
    directions = [(s, t, p) for s, t in ((a, b), (b, a)) for p in PROTOCOLS]
    with busy_cores():
        for phase in range(PHASES):
            before = (a.redis_hits(), b.redis_hits())
            errors: list[str] = []
            threads = [
                threading.Thread(target=share, args=(s, t, p, 1_000_000 * (phase * 4 + n), errors))
                for n, (s, t, p) in enumerate(directions)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=600)
            assert not errors, errors[:5]
            # Each server was asked 2 * PAIRS values the other computed, and nothing else
            # twice: its Redis hits are cross-server hits.
            hits = (a.redis_hits() - before[0], b.redis_hits() - before[1])
            assert min(hits) >= PAIRS, (
                f"phase {phase}: cross-server hits {hits} of {2 * PAIRS} asked of each; "
                f"{a.redis_tier()}; {b.redis_tier()}"
            )
    replicas = {"a": a, "b": b}
    for n, (source_name, target_name, protocol) in enumerate(AFTER):
        source, target = replicas[source_name], replicas[target_name]
        x = float(15_000_000 + n)  # no load request sent it
        made = Caller(source, protocol)
        answer, execution = made.ask(x)
        made.close()
        assert answer == x
        deadline = time.monotonic() + DEADLINE_S
        while not in_redis(server, x):
            assert time.monotonic() < deadline, f"{x} never reached Redis; {source.redis_tier()}"
            time.sleep(0.05)
        cache_hits, executions = target.statistics()
        asked = Caller(target, protocol)
        assert asked.ask(x) == (x, execution), target.redis_tier()  # source's execution
        asked.close()
        assert target.statistics() == (cache_hits + 1, executions), target.redis_tier()
