"""Triton's `TritonPythonModel.auto_complete_config`: called once per load, before the config
is validated, even for a model folder without config.pbtxt; what it returns is the config
inferd checks and serves. In the server process and with `isolation: "process"` (then in a
worker process of its own, as Triton's stub), asked over HTTP and gRPC.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

# Completes everything from nothing; counts its calls in the file named by COUNT_FILE.
COMPLETING_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

COUNT_FILE = {count_file!r}

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        with open(COUNT_FILE, "a") as f:
            f.write("called\\n")
        config = auto_complete_model_config.as_dict()
        assert config["name"] == {name!r} and config["input"] == [], config
        auto_complete_model_config.add_input({{"name": "A", "data_type": "TYPE_FP32", "dims": [2]}})
        auto_complete_model_config.add_input(
            {{"name": "B", "data_type": "TYPE_FP32", "dims": [2], "optional": True}}
        )
        auto_complete_model_config.add_output(
            {{"name": "SUM", "data_type": "TYPE_FP32", "dims": [2]}}
        )
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            total = a + (b.as_numpy() if b is not None else 0)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
"""

# Broken completions, one per model: (name, body of auto_complete_config, words of the reason).
BROKEN = [
    (
        "ac_conflict",
        'c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]}); return c',
        ["ac_conflict/1/model.py: auto_complete_config:", "the model expects dims [3]", "[2]"],
    ),
    (
        "ac_raises",
        'raise RuntimeError("cannot read the weights header")',
        ["ac_raises/1/model.py: auto_complete_config: cannot read the weights header"],
    ),
    (
        "ac_not_config",
        "return c.as_dict()",
        ["auto_complete_config must return a pb_utils.ModelConfig, got dict"],
    ),
    (
        "ac_unhonoured",
        'c.as_dict()["metric_tags"] = {"team": "a"}; return c',
        [
            "ac_unhonoured/config.pbtxt as completed by 1/model.py auto_complete_config",
            "metric_tags",
        ],
    ),
    (
        "ac_smaller_batch",
        "c.set_max_batch_size(2); return c",
        ["configuration specified max_batch_size 8", "specified max_batch_size 2"],
    ),
]

BROKEN_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(c):
        {body}

    def execute(self, requests):
        return []
"""

BROKEN_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "A", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "SUM", data_type: TYPE_FP32, dims: [ 2 ] }} ]
"""

# Only what auto_complete_config cannot say: run it in a worker process, two instances.
PROCESS_CONFIG = """
name: "ac_process"
backend: "python"
instance_group [ { count: 2 } ]
parameters { key: "isolation" value: { string_value: "process" } }
"""


def _write(repo: Path, name: str, code: str, config: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ac_counts")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, counts: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("ac_repo")
    for name, config in (("ac_noconfig", None), ("ac_process", PROCESS_CONFIG)):
        code = COMPLETING_PY.format(count_file=str(counts / name), name=name)
        _write(repo, name, code, config)
    for name, body, _ in BROKEN:
        _write(repo, name, BROKEN_PY.format(body=body), BROKEN_CONFIG.format(name=name))
    with run_server(repo) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


def _config(client: Client, model: str) -> dict[str, Any]:
    if client.protocol == "http":
        return dict(client.raw.get_model_config(model))
    return dict(client.raw.get_model_config(model, as_json=True)["config"])


@pytest.mark.parametrize("model", ["ac_noconfig", "ac_process"])
def test_the_completed_config_is_served(client: Client, counts: Path, model: str) -> None:
    config = _config(client, model)
    assert int(config["max_batch_size"]) == 4
    assert "dynamic_batching" in config
    inputs = {i["name"]: i for i in config["input"]}
    assert set(inputs) == {"A", "B"} and inputs["B"].get("optional") is True
    assert [o["name"] for o in config["output"]] == ["SUM"]
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    result = client.infer(model, {"A": (a, "FP32"), "B": (a, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("SUM"), a * 2)
    alone = client.infer(model, {"A": (a, "FP32")})  # B is optional, as completed
    np.testing.assert_array_equal(alone.as_numpy("SUM"), a)
    # Once per load, not once per instance (ac_process has two).
    assert (counts / model).read_text() == "called\n"


@pytest.mark.parametrize(
    ("model", "words"), [(n, w) for n, _, w in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_a_completion_that_cannot_be_honoured_fails_the_load(
    server: RunningServer, model: str, words: list[str]
) -> None:
    with server.client() as c:
        rows = {row["name"]: row for row in c.post("/v2/repository/index").json()}
        assert c.get(f"/v2/models/{model}/ready").status_code != 200
    reason = rows[model].get("reason", "")
    for word in words:
        assert word in reason, reason
