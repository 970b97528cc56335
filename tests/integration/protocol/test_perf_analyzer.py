"""Triton's own perf_analyzer against inferd: `--shared-memory system` over HTTP and gRPC.

perf_analyzer lives in its own venv, set up by `benchmarks/perf_analyzer.sh --install`
(`make test-tools` runs it); where it is not set up these tests skip and say so.
"""

from __future__ import annotations

import glob
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto

from inferd.dataplane.shm_regions import Lease
from inferd.types import InferRequest
from tests.support.models import builders
from tests.support.servers import RunningServer, run_server

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "perf_analyzer.sh"
VENV = ROOT / "benchmarks" / ".venv-perf-analyzer"
REQUESTS = 200


def _not_set_up() -> str:
    """Why perf_analyzer cannot run here, or "" when it can."""
    if not (VENV / "bin" / "perf_analyzer").exists():
        return f"perf_analyzer is not set up: run `make test-tools` or `{SCRIPT.name} --install`"
    if not glob.glob(
        str(VENV / "lib/python*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12")
    ):
        return "perf_analyzer's libcudart.so.12 is missing: rerun `perf_analyzer.sh --install`"
    libraries = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libb64.so.0d" not in libraries:
        return "perf_analyzer needs libb64 (Debian: libb64-0d): rerun `perf_analyzer.sh --install`"
    return ""


pytestmark = pytest.mark.skipif(bool(_not_set_up()), reason=_not_set_up() or "set up")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("pa_repo")
    builders._save(builders.identity(TensorProto.FLOAT, ["batch", "n"]), repo / "fp32/1/model.onnx")
    with run_server(repo) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(
    server: RunningServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Count the requests whose tensors came through shared memory (the real table does the
    # work; the count only watches it).
    table = server.server.dataplane.shared_memory
    leased: list[InferRequest] = []
    real_lease = table.lease

    def counting_lease(request: InferRequest) -> Lease:
        leased.append(request)
        return real_lease(request)

    monkeypatch.setattr(table, "lease", counting_lease)
    url = f"127.0.0.1:{server.port}" if protocol == "http" else server.grpc_address
    args: list[Any] = [
        "bash", SCRIPT, "-m", "fp32", "-u", url, "-i", protocol,
        "--shared-memory", "system", "--output-shared-memory-size", "64",
        "--shape", "INPUT0:16", "--concurrency-range", "1", "--request-count", REQUESTS,
    ]  # fmt: skip
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert len(leased) >= REQUESTS, output[-3000:]
    first = leased[0]
    assert first.inputs[0].shared_memory is not None  # the input came through a region...
    assert first.outputs and first.outputs[0].shared_memory is not None  # ...the output too
    assert table.status() == []  # perf_analyzer unregistered its regions when it finished
