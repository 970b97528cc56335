"""Poll mode under continuous load: 20 version swaps, zero failed requests, memory back.

The server runs as its own process (the real CLI), so its memory can be read on its own.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.lifecycle_models import plus, write_plus_model, write_plus_version
from tests.support.models import builders
from tests.support.process_memory import rss_kib
from tests.support.servers import CliServer, run_cli_server

CLIENTS = 8
SWAPS = 20


@pytest.fixture
def poll_server(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    repo = tmp_path / "repo"
    write_plus_model(repo, "swap", [1])
    args = ("--grpc-port", "0", "--metrics-port", "0", "--model-control-mode", "poll",
            "--repository-poll-secs", "0.1", "--log-level", "WARNING")  # fmt: skip
    with run_cli_server(repo, tmp_path / "server.log", *args) as server:
        yield server.url, repo, server.proc
        server.stop()


class Load:
    """CLIENTS threads sending requests until stopped, recording every answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers: Counter[str] = Counter()
        self.failures: list[str] = []
        self.mismatches: list[str] = []
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def _client(self) -> None:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                r = client.post("/v2/models/swap/infer", json=body)
                with self.lock:
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code} {r.text}")
                        continue
                    doc = r.json()
                    version = doc["model_version"]
                    values = set(doc["outputs"][0]["data"])
                    # One version computed the whole answer, and it is the one named.
                    if values != {float(version)}:
                        self.mismatches.append(f"v{version} answered {values}")
                    self.answers[version] += 1


def wait_for_version(url: str, version: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = httpx.get(f"{url}/v2/models/swap").json()
        if meta.get("versions") == [str(version)]:
            return
        time.sleep(0.05)
    raise AssertionError(f"version {version} never became the only one served")


def test_twenty_swaps_under_load(poll_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, repo, proc = poll_server
    staging = tmp_path / "staging"
    staging.mkdir()
    with Load(url) as load:
        time.sleep(1.0)  # warm traffic before measuring the baseline
        # Two swaps first, so allocator pools that any reload fills are in the baseline.
        for version in (2, 3):
            write_plus_version(repo / "swap", version, staging)
            wait_for_version(url, version)
        time.sleep(0.5)
        baseline = rss_kib(proc.pid)
        for version in range(4, 4 + SWAPS):
            write_plus_version(repo / "swap", version, staging)
            wait_for_version(url, version)
        time.sleep(1.0)
    after = rss_kib(proc.pid)
    assert load.failures == [], load.failures[:5]
    assert load.mismatches == [], load.mismatches[:5]
    served = {int(v) for v in load.answers}
    assert served >= {1, 3 + SWAPS}, sorted(served)
    assert sum(load.answers.values()) > 200
    assert after <= baseline * 1.10, (
        f"RSS grew from {baseline} KiB to {after} KiB over {SWAPS} swaps"
    )


def test_broken_version_leaves_the_old_one_serving(poll_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, repo, _ = poll_server
    staging = tmp_path / "staging"
    staging.mkdir()
    write_plus_version(repo / "swap", 2, staging)
    wait_for_version(url, 2)
    broken = staging / "3"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"this is not an onnx file")
    with Load(url) as load:
        broken.rename(repo / "swap" / "3")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = [
                r for r in httpx.post(f"{url}/v2/repository/index").json() if r["name"] == "swap"
            ]
            reasons = " ".join(r.get("reason", "") for r in rows)
            if "failed" in reasons:
                break
            time.sleep(0.05)
        time.sleep(0.5)
    assert load.failures == []
    assert set(load.answers) == {"2"}
    # The failure is visible: either on version 3's row, or on the version still serving.
    assert "swap/3/model.onnx" in reasons, rows
    assert any(r.get("version") == "2" and r["state"] == "READY" for r in rows)
    # A fixed version 3 then replaces it.
    shutil.rmtree(repo / "swap" / "3")
    write_plus_version(repo / "swap", 3, staging)
    wait_for_version(url, 3)


def wait_for_log(server: CliServer, text: str, count: int = 1, timeout_s: float = 30) -> str:
    """Wait until the server's log holds `text` at least `count` times; return the log."""
    deadline = time.monotonic() + timeout_s
    while (log := server.output()).count(text) < count:
        assert time.monotonic() < deadline, f"{text!r} never logged {count}x:\n{log[-2000:]}"
        time.sleep(0.05)
    return log


def test_touch_without_change_does_not_reload(tmp_path: Path) -> None:
    """A new mtime with the same bytes moves the poller's fingerprint, so it looks again,
    but the version's content checksum is unchanged: the instance serving stays. Different
    bytes in the same version directory, by contrast, do swap it, which shows this test
    sees a reload when one happens."""
    repo = tmp_path / "repo"
    write_plus_model(repo, "swap", [1])
    args = ("--model-control-mode", "poll", "--repository-poll-secs", "0.1",
            "--log-level", "INFO")  # fmt: skip
    loaded = "loaded model swap version 1 "
    with run_cli_server(repo, tmp_path / "server.log", *args) as server:
        wait_for_log(server, loaded)
        model_file = repo / "swap" / "1" / "model.onnx"
        model_file.write_bytes(model_file.read_bytes())  # same bytes, new mtime
        wait_for_log(server, "model swap changed: loading")
        # The poller handles models one after the other: once a model added after the
        # touch is ready, the reload attempt the touch caused is over.
        write_plus_model(repo, "sentinel", [1])
        log = wait_for_log(server, "loaded model sentinel version 1 ")
        assert log.count(loaded) == 1, log
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
        assert (
            httpx.post(f"{server.url}/v2/models/swap/infer", json=body).json()["outputs"][0]["data"]
            == [1.0] * 4
        )

        staged = tmp_path / "model.onnx"
        builders._save(plus(7.0), staged)
        staged.replace(model_file)  # other bytes, same version
        wait_for_log(server, loaded, count=2)
        deadline = time.monotonic() + 30
        while (r := httpx.post(f"{server.url}/v2/models/swap/infer", json=body)).json()["outputs"][
            0
        ]["data"] != [7.0] * 4:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)


def test_model_added_and_removed(poll_server) -> None:  # type: ignore[no-untyped-def]
    url, repo, _ = poll_server
    write_plus_model(repo, "added", [1])
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/v2/models/added/ready").status_code != 200:
        assert time.monotonic() < deadline, "the new model was never loaded"
        time.sleep(0.05)
    shutil.rmtree(repo / "added")
    while httpx.get(f"{url}/v2/models/added/ready").status_code != 404:
        assert time.monotonic() < deadline, "the removed model was never unloaded"
        time.sleep(0.05)
