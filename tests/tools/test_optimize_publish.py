"""`inferd optimize --publish --server` against a real server in poll mode: clients keep
sending while the new version is swapped in, none fails, and the server ends up serving the
published version with the recorded checksum; with --canary, the routing API splits the
traffic (the admin token taken from INFERD_ADMIN_TOKEN)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from inferd.dataplane.access import TOKEN_ENV
from tests.support.optimize_models import write_mlp
from tests.support.optimize_runs import optimize
from tests.support.servers import STATE_DEADLINE_S, run_server

CLIENTS = 4
LOAD_LIMIT_S = 300.0  # the clients stop by themselves at the latest after this
TOKEN = "optimize-canary-token-0123456789"
BODY = {
    "inputs": [
        {
            "name": "input",
            "datatype": "FP32",
            "shape": [1, 64],
            "data": np.linspace(-1, 1, 64).tolist(),
        }
    ]
}
CANARY_CONFIG = """
version_policy: { latest { num_versions: 2 } }
parameters { key: "canary_auto_rollback" value: { string_value: "true" } }
"""


class Load:
    """CLIENTS threads sending requests without a version until stopped, counting answers
    by the version that computed them, and every failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.versions: Counter[str] = Counter()
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _client(self) -> None:
        end = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set() and time.monotonic() < end:
                try:
                    r = client.post("/v2/models/mlp/infer", json=BODY)
                except httpx.HTTPError as e:
                    with self.lock:
                        self.failures.append(repr(e))
                    continue
                with self.lock:
                    if r.status_code == 200:
                        self.versions[r.json()["model_version"]] += 1
                    else:
                        self.failures.append(f"{r.status_code} {r.text}")

    def count(self, version: str) -> int:
        with self.lock:
            return self.versions[version]

    def wait_for(self, version: str, answers: int) -> None:
        """Until `answers` more answers came from `version`, or fail at the deadline."""
        target = self.count(version) + answers
        deadline = time.monotonic() + STATE_DEADLINE_S
        while self.count(version) < target:
            assert time.monotonic() < deadline, (
                f"no {answers} answers from version {version} within {STATE_DEADLINE_S:.0f} "
                f"s: {dict(self.versions)}, failures {self.failures[:3]}"
            )
            time.sleep(0.01)


PUBLISH = ["--try", "int8-dynamic", "--min-speedup", "0", "--max-accuracy-drop", "10%"]


def test_publishing_on_a_polling_server_swaps_with_no_failed_request(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_mlp(repo)
    with (
        run_server(repo, model_control_mode="poll", repository_poll_s=0.1) as server,
        Load(server.url) as load,
    ):
        load.wait_for("1", 20)
        run = optimize(
            repo, "mlp", *PUBLISH, "--publish", "--server", server.url,
            report=tmp_path / "report.json",
        )  # fmt: skip
        assert run.code == 0, run.stderr
        # optimize returned once the server served version 2 with the recorded checksum
        assert run.report["published"]["served"] is True
        assert "waiting for" in run.stderr
        load.wait_for("2", 20)
        with server.client() as c:
            config = c.get("/v2/models/mlp/versions/2/config").json()
            index = c.post("/v2/repository/index").json()
    assert load.failures == []
    assert (
        config["parameters"]["model_checksum"]["string_value"]
        == (run.report["published"]["checksum"])
    )
    states = {(row["version"], row["state"]) for row in index if row["name"] == "mlp"}
    assert ("2", "READY") in states and ("1", "READY") not in states  # latest 1: swapped


def test_a_canary_gets_its_share_through_the_routing_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    write_mlp(repo, extra=CANARY_CONFIG)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with run_server(
        repo, model_control_mode="poll", repository_poll_s=0.1, admin_api=True, admin_token=TOKEN
    ) as server:
        refused = optimize(
            repo, "mlp", *PUBLISH, "--publish", "--canary", "25", "--server", server.url
        )
        assert refused.code == 2
        assert f"set {TOKEN_ENV} to the server's admin token" in refused.stderr
        assert not (repo / "mlp" / "2").exists()  # checked before anything was written

        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        with Load(server.url) as load:
            run = optimize(
                repo, "mlp", *PUBLISH, "--publish", "--canary", "25", "--server", server.url,
                report=tmp_path / "report.json",
            )  # fmt: skip
            assert run.code == 0, run.stderr
            load.wait_for("2", 10)
            load.wait_for("1", 10)
        headers = {"authorization": f"Bearer {TOKEN}"}
        with server.client(headers=headers) as c:
            routing = c.get("/v2/models/mlp/routing").json()
    assert load.failures == []
    assert routing["weights"] == {"2": 25, "1": 75}
    assert routing["auto_rollback"] is True  # the guard watches the canary
    assert run.report["published"]["routing"]["weights"] == {"2": 25, "1": 75}


def test_a_server_that_does_not_pick_the_version_up_exits_1(tmp_path: Path) -> None:
    """Model control mode none: the version is written, but never served; optimize says so."""
    repo = tmp_path / "repo"
    write_mlp(repo)
    with run_server(repo) as server:
        run = optimize(
            repo, "mlp", *PUBLISH, "--publish", "--server", server.url, "--wait-s", "0.5",
            report=tmp_path / "report.json",
        )  # fmt: skip
    assert run.code == 1
    assert "the server did not serve mlp version 2 with checksum sha256:" in run.stderr
    assert "--model-control-mode poll" in run.stderr
    assert (repo / "mlp" / "2" / "model.onnx").is_file()  # written, and the report says so
    assert run.report["published"]["version"] == 2 and "error" in run.report["published"]
    assert "published: mlp version 2 in" in run.stdout and "not completed:" in run.stdout
