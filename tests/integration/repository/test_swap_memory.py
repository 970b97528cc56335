"""Hot swaps give memory back (field lesson 13).

Nothing of a swapped-out or failed version stays reachable (weak references to its ONNX
Runtime session, its Python model, class and module die with the swap), and under load, 20
swaps of a 64 MiB ONNX model and a 64 MiB Python model leave the server's resident memory
within 10% of what it was before the first swap: in one process, with `--workers 2`, and
with the Python model in worker processes of its own (their memory counted too). A leak of
2 MiB per swap fails that (docs/benchmarks.md, "Memory across hot swaps").
"""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.backends.onnx import OnnxInstance
from inferd.backends.python.isolated.isolated_instance import ProcessInstance
from inferd.backends.python.python_backend import PythonInstance  # type: ignore[attr-defined]
from tests.support.lifecycle_models import write_plus_model, write_plus_version, write_python_model
from tests.support.servers import RunningServer, run_server
from tests.support.swap_memory import (
    GROWTH_BOUND,
    MODELS,
    Load,
    serve,
    tree_rss_bytes,
    write_repository,
    write_version,
)

HELD_PY = """
import numpy as np

class Model:
    def load(self, context):
        self.version = float(context.version)
        self.weights = [np.ones(1 << 16, np.float32) for _ in range(4)]
        if self.version == 2:  # fails its load, holding its weights
            raise RuntimeError("version 2 refuses to load")

    def predict(self, inputs):
        x = inputs["IN"]
        return {"OUT": np.full(x.shape, self.version, dtype=np.float32)}
"""
PROCESS = 'parameters { key: "isolation" value: { string_value: "process" } }'


def _client(server: RunningServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    return grpcclient.InferenceServerClient(server.grpc_address)


def _instance(server: RunningServer, model: str, version: str = "1") -> Any:
    batcher = server.server.registry.models[model].versions[version].batcher
    assert batcher is not None
    (instance,) = batcher._instances  # type: ignore[attr-defined]
    return instance


def _model_objects(name: str) -> list[object]:
    """Every `Model` object made from `<name>`'s model.py (any version) that has not been
    freed: reachable, or garbage not collected yet (no collection here: the server's
    release must have done it). Frozen objects are looked at too."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    try:
        return [
            o
            for o in gc.get_objects()
            if type(o).__name__ == "Model" and type(o).__module__.endswith(f"_{name}")
        ]
    finally:
        if frozen:
            gc.freeze()


@pytest.fixture
def explicit_server(tmp_path: Path) -> Any:
    repo = tmp_path / "repo"
    write_plus_model(repo, "plus", [1])
    write_python_model(repo, "held", HELD_PY)
    write_python_model(repo, "isolated", HELD_PY, extra=PROCESS)
    with run_server(repo, model_control_mode="explicit", load_models=("*",)) as server:
        yield server, repo


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_swapped_out_version_is_unreachable(explicit_server: Any, protocol: str) -> None:
    server, repo = explicit_server
    onnx = _instance(server, "plus")
    held = _instance(server, "held")
    isolated = _instance(server, "isolated")
    assert isinstance(onnx, OnnxInstance) and isinstance(held, PythonInstance)
    assert isinstance(isolated, ProcessInstance)
    # The first version was loaded before the server froze its objects (gc.freeze): the
    # release must reach into the frozen generation too.
    refs = {
        "the ONNX Runtime session": weakref.ref(onnx._session),
        "the ONNX instance": weakref.ref(onnx),
        "the Python model": weakref.ref(held._model),
        # A class is always in a reference cycle: only a collection frees it.
        "the Python model's class": weakref.ref(type(held._model)),
        "the Python module": weakref.ref(sys.modules[held._module_name]),
        "the Python instance": weakref.ref(held),
    }
    worker_pid = isolated.pid
    assert worker_pid is not None
    del onnx, held, isolated
    write_plus_version(repo / "plus", 2)
    # Version 3 of the Python models (HELD_PY's version 2 fails its warm-up).
    (repo / "held" / "3").mkdir()
    (repo / "held" / "3" / "model.py").write_text(HELD_PY)
    (repo / "isolated" / "3").mkdir()
    (repo / "isolated" / "3" / "model.py").write_text(HELD_PY)
    client = _client(server, protocol)
    try:
        for name in ("plus", "held", "isolated"):
            client.load_model(name)  # returns once the old version is drained and released
    finally:
        client.close()
    alive = [what for what, ref in refs.items() if ref() is not None]
    assert alive == [], f"still reachable after the swap: {alive}"
    assert _model_objects("held") == [_instance(server, "held", "3")._model]
    assert not Path(f"/proc/{worker_pid}").exists(), "the old worker process is still there"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failed_load_leaves_nothing_behind(
    explicit_server: Any, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, repo = explicit_server
    (repo / "held" / "2").mkdir()
    (repo / "held" / "2" / "model.py").write_text(HELD_PY)  # its load fails
    client = _client(server, protocol)
    try:
        with (
            caplog.at_level(logging.INFO, logger="inferd.memory"),
            pytest.raises(InferenceServerException, match="version 2 refuses to load"),
        ):
            client.load_model("held")
    finally:
        client.close()
    # Version 1 still serves; version 2 is listed as failed, and its model object is gone.
    rows = [r for r in server.server.registry.index() if r["name"] == "held"]
    assert [(r["version"], r["state"]) for r in rows] == [("1", "READY"), ("2", "UNAVAILABLE")]
    (survivor,) = _model_objects("held")
    assert survivor is _instance(server, "held")._model
    released = [r for r in caplog.records if getattr(r, "event", "") == "memory_released"]
    assert [(r.model, r.versions, r.reason) for r in released] == [  # type: ignore[attr-defined]
        ("held", ["2"], "load_failed")
    ]


# -- 20 swaps of realistic sizes under load ------------------------------------------------

SWAPS = 20
CASES = [
    pytest.param((), "thread", id="one-process"),
    pytest.param(("--workers", "2"), "thread", id="workers-2"),
    pytest.param((), "process", id="process-isolation"),
]


@pytest.mark.memory
@pytest.mark.parametrize(("args", "isolation"), CASES)
def test_twenty_swaps_give_memory_back(
    tmp_path: Path, args: tuple[str, ...], isolation: str
) -> None:
    repo = tmp_path / "repo"
    write_repository(repo, isolation)
    workers = 2 if "--workers" in args else 1
    with (
        serve(repo, tmp_path / "server.log", *args) as server,
        # One gRPC channel reaches one worker: a client pair per worker.
        Load(server.http_port, server.grpc_port, clients_per_protocol=workers) as load,
    ):
        load.wait_answers(40)  # version 1 under traffic before the baseline
        baseline, baseline_tree = server.memory(workers), tree_rss_bytes(server.proc.pid)
        for version in range(2, 2 + SWAPS):
            write_version(repo, version)
            # Both models, in every worker: released, not only switched.
            server.wait_unloads(len(MODELS) * workers * (version - 1))
        load.wait_answers(load.total() + 40)  # the last version under traffic too
        after, after_tree = server.memory(workers), tree_rss_bytes(server.proc.pid)
        returned = server.metric("inferd_process_memory_returned_bytes_total")
        releases = server.log_events("memory_released")
    assert load.failures == [], load.failures[:5]
    served = {(protocol, model, version) for protocol, model, version in load.answers}
    last = str(1 + SWAPS)
    for protocol in ("http", "grpc"):
        for model in MODELS:
            assert {(protocol, model, "1"), (protocol, model, last)} <= served, sorted(served)
    # Every pass of the repository poller was a swap: none read a model again between two
    # (one that did could still hold a model's worth of memory when the figure was read).
    passes = Counter(r["reason"] for r in releases)
    assert passes == {"unloaded": len(MODELS) * workers * SWAPS}, passes
    mib = 1 << 20
    assert after <= baseline * GROWTH_BOUND, (
        f"resident memory grew from {baseline / mib:.0f} MiB to {after / mib:.0f} MiB "
        f"over {SWAPS} swaps"
    )
    tree = (baseline_tree / mib, after_tree / mib)
    assert after_tree <= baseline_tree * GROWTH_BOUND, tree
    # Every release was logged with the RSS around it; the counter adds up what they gave.
    assert all(
        r["rss_after_bytes"] < r["rss_before_bytes"] for r in releases if r["model"] == "weights"
    )
    assert returned == sum(r["returned_bytes"] for r in releases)
    # At least the 64 MiB of ONNX weights per swap and worker came back.
    assert returned >= SWAPS * workers * 64 * mib
