"""The whole `triton_python_backend_utils` surface, walked by a model inside a real server.

tests/support/pb_utils_checks.py holds one check per name Triton documents; a `TritonPythonModel`
runs them all in its `execute` and answers the report. Every name must work, or raise an
error that names it: nothing silently missing. Walked in the server process and in a worker
process (`isolation: "process"`), asked over HTTP and gRPC.
"""

from __future__ import annotations

import json
import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.backends.python import pb_utils
from tests.support.pb_utils_checks import CHECKS, TRITON_NAMES
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

WALK_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from tests.support.pb_utils_checks import Context, run_checks

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            context = Context(pb_utils, request, "other", self.name, pb_utils.get_model_dir())
            report = json.dumps(run_checks(context)).encode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.zeros(1, np.float32)),
                pb_utils.Tensor("REPORT", np.array([report], dtype=object)),
            ]))
        return responses
"""

# The same walk in a decoupled model: the report goes through the request's sender.
WALK_DECOUPLED_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from tests.support.pb_utils_checks import Context, run_checks

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            context = Context(
                pb_utils, request, "other", "walk_decoupled", pb_utils.get_model_dir(), True
            )
            report = json.dumps(run_checks(context)).encode()
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.zeros(1, np.float32)),
                pb_utils.Tensor("REPORT", np.array([report], dtype=object)),
            ])
            sender = request.get_response_sender()
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

WALK_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "REPORT", data_type: TYPE_STRING, dims: [ 1 ] }}
]
parameters {{ key: "auto_warmup" value: {{ string_value: "false" }} }}
{extra}
"""

OTHER_PY = """
class Model:
    def predict(self, inputs):
        return {"OUT": inputs["IN"]}
"""

OTHER_CONFIG = """
name: "other"
backend: "python"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

PROCESS = 'parameters { key: "isolation" value: { string_value: "process" } }'


def _write(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def walk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("walk_repo")
    _write(repo, "walk_thread", WALK_CONFIG.format(name="walk_thread", extra=""), WALK_PY)
    _write(repo, "walk_process", WALK_CONFIG.format(name="walk_process", extra=PROCESS), WALK_PY)
    decoupled = "model_transaction_policy { decoupled: true }"
    _write(
        repo,
        "walk_decoupled",
        WALK_CONFIG.format(name="walk_decoupled", extra=decoupled),
        WALK_DECOUPLED_PY,
    )
    _write(repo, "other", OTHER_CONFIG, OTHER_PY)
    with run_server(repo, admin_api=True) as running:
        yield running


def test_the_checks_cover_tritons_list_exactly() -> None:
    names = [check.name for check in CHECKS]
    assert len(names) == len(set(names)), "a name is checked twice"
    assert set(names) == set(TRITON_NAMES)
    # Whatever inferd's pb_utils exports beyond Triton's list is on it too (or a type).
    exported = {n.split(".")[0] for n in TRITON_NAMES} | {"LogLevel", "MetricKind"}
    extra = set(pb_utils.__all__) - exported - {"InferenceTrace", "PreferredMemory"}
    assert not extra, f"exported but not in the table: {extra}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["walk_thread", "walk_process"])
def test_every_documented_name_works_or_refuses_naming_itself(
    walk_server: RunningServer, protocol: str, model: str
) -> None:
    client = Client(protocol, walk_server)
    try:
        result = client.infer(
            model,
            {"IN": (np.zeros(1, np.float32), "FP32")},
            outputs=["OUT", "REPORT"],
            request_id="walk-request",
            parameters={"walk": "yes"},
        )
    finally:
        client.raw.close()
    report = _checked_report(result.as_numpy("REPORT")[0])
    refused = {row["name"] for row in report if row["outcome"] == "refused"}
    assert refused == REFUSED | {"InferenceRequest.get_response_sender"}
    skipped = {row["name"] for row in report if row["outcome"] == "skipped"}
    assert skipped == {"InferenceResponseSender.send", "InferenceResponseSender.is_cancelled"}


# Refused in every model: what inferd does not implement.
REFUSED = {
    "InferenceRequest.set_release_flags",
    "unload_model(unload_dependents=True)",
}


def _checked_report(raw: bytes) -> list[dict[str, str]]:
    report: list[dict[str, str]] = json.loads(raw)
    assert [row["name"] for row in report] == [check.name for check in CHECKS]
    wrong = [row for row in report if row["outcome"] != row["expected"]]
    assert not wrong, json.dumps(wrong, indent=1)
    return report


def test_a_decoupled_model_walks_the_response_sender_too(walk_server: RunningServer) -> None:
    # A decoupled model answers over a stream: gRPC ModelStreamInfer, Triton's client.
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(walk_server.grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_stream_infer(
            "walk_decoupled",
            [inp],
            request_id="walk-request",
            outputs=[grpcclient.InferRequestedOutput(n) for n in ("OUT", "REPORT")],
            parameters={"walk": "yes"},
        )
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            if result.as_numpy("REPORT") is not None:
                break
    finally:
        client.stop_stream()
        client.close()
    report = _checked_report(result.as_numpy("REPORT")[0])
    assert {row["name"] for row in report if row["outcome"] == "refused"} == REFUSED
    assert not [row for row in report if row["outcome"] == "skipped"]


def test_the_walks_metrics_are_exported(walk_server: RunningServer) -> None:
    import httpx

    client = Client("grpc", walk_server)
    try:
        for model in ("walk_thread", "walk_process"):
            client.infer(
                model,
                {"IN": (np.zeros(1, np.float32), "FP32")},
                parameters={"walk": "yes"},
            )
    finally:
        client.raw.close()
    text = httpx.get(walk_server.metrics_url, timeout=30).text
    for model in ("walk_thread", "walk_process"):
        assert f'walk_gauge{{run="{model}"}} 42.0' in text, text
        assert f'walk_histogram_bucket{{le="10.0",run="{model}"}}' in text
        assert f'walk_histogram_count{{run="{model}"}}' in text
    assert "# TYPE walk_counter counter" in text
    assert "# HELP walk_counter a COUNTER of the API walk" in text


# Tries the model management calls it is told to, and answers with what each raised.
TRY_LOAD_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        outcomes = []
        for call in (
            lambda: pb_utils.load_model("other"),
            lambda: pb_utils.unload_model("other"),
            lambda: pb_utils.load_model("{name}"),
        ):
            try:
                call()
                outcomes.append("done")
            except pb_utils.TritonModelException as exc:
                outcomes.append(exc.message())
        report = np.array(["\\n".join(outcomes).encode()], dtype=object)
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.zeros(1, np.float32)),
                pb_utils.Tensor("REPORT", report),
            ])
            for _ in requests
        ]
"""


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_model_management_is_refused_naming_the_call_without_the_admin_api(
    tmp_path: Path, isolation: str
) -> None:
    name = f"try_{isolation}"
    extra = PROCESS if isolation == "process" else ""
    _write(
        tmp_path,
        name,
        WALK_CONFIG.format(name=name, extra=extra),
        TRY_LOAD_PY.replace("{name}", name),
    )
    _write(tmp_path, "other", OTHER_CONFIG, OTHER_PY)
    with run_server(tmp_path) as server:  # the admin API is off by default
        client = Client("http", server)
        try:
            result = client.infer(name, {"IN": (np.zeros(1, np.float32), "FP32")})
        finally:
            client.raw.close()
        load, unload, itself = result.as_numpy("REPORT")[0].decode().split("\n")
        assert load.startswith("pb_utils.load_model('other'): the repository API is disabled")
        assert unload.startswith("pb_utils.unload_model('other'): the repository API is disabled")
        assert itself.startswith(
            f"pb_utils.load_model('{name}'): a model cannot load or unload itself"
        )
        with server.client() as c:  # nothing changed
            assert c.get("/v2/models/other/ready").status_code == 200
