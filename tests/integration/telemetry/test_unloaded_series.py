"""An unloaded version's series and statistics go with it, as Triton's do (issue 34).

Hot swaps through the repository API (HTTP and gRPC, one case table) and through the
repository poll with `--workers 2`: after each swap /metrics holds series of the loaded
version only, its size stays flat however many versions came before, nothing the server keeps
per version outlives its version, and the statistics API lists the loaded versions, counting
from zero a version loaded again after an unload.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from inferd.cache.cache_settings import parse_cache_config
from tests.support.lifecycle_models import write_plus_model, write_plus_version
from tests.support.server_process import free_port
from tests.support.servers import CliServer, RunningServer, run_cli_server, run_server

MODEL = "swap"
SWAPS = 8
PROTOCOLS = ["http", "grpc"]
# A local response cache and a sampled capture: more of what is kept per version and model.
EXTRA = """
response_cache { enable: true }
parameters { key: "capture_sample_rate" value: { string_value: "1" } }
"""


def _client(server: RunningServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    return grpcclient.InferenceServerClient(server.grpc_address)


def _traffic(client: Any, protocol: str, version: int) -> None:
    """Answers from `version` (two of them cached), and a request it refuses (a failure
    counted under the version)."""
    lib = httpclient if protocol == "http" else grpcclient
    for value in (0.0, 1.0, 1.0):
        x = lib.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.full((1, 4), value, np.float32))
        result = client.infer(MODEL, [x])
        assert result.as_numpy("y").tolist() == [[value + version] * 4]
    wrong = lib.InferInput("x", [1, 3], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [wrong])


def _versions(text: str) -> set[str]:
    """The `version` label values of every series of MODEL in a scrape."""
    return {
        s.labels["version"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model") == MODEL and "version" in s.labels
    }


def _series(text: str) -> list[str]:
    """The sample lines of MODEL's series, version numbers and values left out: what a swap
    must leave as it was."""
    lines = [line for line in text.splitlines() if f'model="{MODEL}"' in line]
    return sorted(re.sub(r'version="\d+"', 'version="N"', line.rsplit(" ", 1)[0]) for line in lines)


def _kept_versions(server: RunningServer) -> set[tuple[str, ...]]:
    """Every (model, version) key of MODEL the server keeps counts, windows or series for."""
    s = server.server
    assert s.metrics is not None and s.response_cache is not None
    metrics = s.metrics
    feedback = s.capture.feedback
    shared: list[Any] = [
        metrics.series, metrics.failures, metrics.stream_responses, metrics.batch_closes,
        metrics.execution_timeouts, metrics.bisections, metrics._windows,
        s.dataplane.statistics.sink.versions, s.capture.captured, feedback.windows,
        feedback.counts,
    ]  # fmt: skip
    keys = {key[:2] for d in shared for key in d if key[0] == MODEL}
    keys |= {(MODEL, p.version) for p in feedback._pending.get(MODEL, {}).values()}
    return keys


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    repo = tmp_path / "repo"
    write_plus_model(repo, MODEL, [1], extra=EXTRA)
    with run_server(
        repo,
        model_control_mode="explicit",
        load_models=(MODEL,),
        metrics_triton_names=True,
        cache=parse_cache_config(["local,size=1048576"]),
    ) as server:
        yield server, repo


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_swapped_out_versions_leave_metrics(
    explicit: tuple[RunningServer, Path], protocol: str
) -> None:
    server, repo = explicit
    client = _client(server, protocol)
    shapes: dict[int, list[str]] = {}
    sizes: dict[int, int] = {}
    try:
        for version in range(2, 2 + SWAPS):
            _traffic(client, protocol, version - 1)
            write_plus_version(repo / MODEL, version)
            client.load_model(MODEL)  # returns once the old version drained and unloaded
            text = httpx.get(server.metrics_url).text
            assert _versions(text) == {str(version)}, f"after swap {version - 1}"
            assert _kept_versions(server) == set(), f"after swap {version - 1}"
            shapes[version], sizes[version] = _series(text), len(text)
            _traffic(client, protocol, version)
            assert {v for _, v in _kept_versions(server)} == {str(version)}
    finally:
        client.close()
    # Every swap leaves the same series: the scrape's size does not grow with the versions
    # loaded before (before the fix: 10 KB more per swap here, 33 KB -> 104 KB over 8 swaps).
    last = 1 + SWAPS
    assert shapes[3] == shapes[last]
    assert sizes[last] <= sizes[3] * 1.02, sizes


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics_list_loaded_versions_and_start_again_after_unload(
    explicit: tuple[RunningServer, Path], protocol: str
) -> None:
    server, repo = explicit
    client = _client(server, protocol)

    def stats(version: str = "") -> list[dict[str, Any]]:
        if protocol == "http":
            doc = client.get_inference_statistics(MODEL, version)
            return list(doc["model_stats"])
        reply = client.get_inference_statistics(MODEL, version, as_json=True)
        return [
            {"version": s["version"], "inference_count": int(s.get("inference_count", 0))}
            for s in reply.get("model_stats", [])
        ]

    try:
        for version in (2, 3):
            _traffic(client, protocol, version - 1)
            write_plus_version(repo / MODEL, version)
            client.load_model(MODEL)
        _traffic(client, protocol, 3)
        assert [(s["version"], s["inference_count"]) for s in stats()] == [("3", 2)]
        with pytest.raises(InferenceServerException, match="unknown version '2'"):
            stats("2")
        client.unload_model(MODEL)
        unloaded = httpx.get(server.metrics_url).text
        assert stats() == []
        client.load_model(MODEL)  # version 3 again: a new load, counted from zero
        assert [(s["version"], s["inference_count"]) for s in stats()] == [("3", 0)]
        assert f'model="{MODEL}"' not in unloaded  # the model's own series went too
        assert _versions(httpx.get(server.metrics_url).text) == {"3"}
    finally:
        client.close()


# -- --workers 2: the supervisor's merged scrape ------------------------------------------


def _wait_unloads(server: CliServer, count: int, timeout_s: float = 120) -> None:
    """Until both workers logged `count` unloads in all (each unloads every old version)."""
    deadline = time.monotonic() + timeout_s
    while server.output().count(f"unloaded model {MODEL} version") < count:
        assert server.proc.poll() is None, server.output()[-3000:]
        assert time.monotonic() < deadline, server.output()[-3000:]
        time.sleep(0.05)


def test_the_supervisors_scrape_stays_flat_with_workers(tmp_path: Path) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    staging.mkdir()
    write_plus_model(repo, MODEL, [1])
    metrics_port = free_port()
    args = ("--workers", "2", "--metrics-port", str(metrics_port), "--metrics-triton-names",
            "--model-control-mode", "poll", "--repository-poll-secs", "0.1",
            "--log-level", "INFO")  # fmt: skip
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    sizes: dict[int, int] = {}
    shapes: dict[int, list[str]] = {}
    with run_cli_server(repo, tmp_path / "server.log", *args) as server, httpx.Client() as http:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
        for version in range(2, 2 + SWAPS):
            # Answers on both workers (new connections spread over the shared port).
            for _ in range(8):
                r = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=body)
                assert r.status_code == 200, r.text
            write_plus_version(repo / MODEL, version, staging)
            _wait_unloads(server, 2 * (version - 1))
            text = http.get(url).text
            assert _versions(text) == {str(version)}, f"after swap {version - 1}"
            assert 'worker="0"' in text and 'worker="1"' in text
            sizes[version], shapes[version] = len(text), _series(text)
    last = 1 + SWAPS
    assert shapes[3] == shapes[last]
    assert sizes[last] <= sizes[3] * 1.02, sizes
