"""Models written for Triton's Python backend (`TritonPythonModel`, `pb_utils`), served as is.

Checked over HTTP and gRPC with Triton's own clients: Triton's add_sub example, a batched
model answering each request of a batch separately (or failing it alone), and the contract
around `initialize(args)`, `execute(requests)` and `finalize()`.
"""

from __future__ import annotations

import json
import queue
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.models import EXAMPLES
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

# Batched: answers each request of a batch on its own; a negative input fails that request.
TBATCH_PY = """
import itertools, json, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.args = json.dumps({
            "config_name": config["name"],
            "max_batch_size": config["max_batch_size"],
            "greeting": config["parameters"]["greeting"]["string_value"],
            "instance_name": args["model_instance_name"],
            "kind": args["model_instance_kind"],
            "device_id": args["model_instance_device_id"],
            "repository": args["model_repository"],
            "version": args["model_version"],
            "model_name": args["model_name"],
        })
        self.delay_s = float(config["parameters"]["delay_ms"]["string_value"]) / 1000
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUT")["data_type"])
        self.executions = itertools.count(1)

    def execute(self, requests):
        time.sleep(self.delay_s)
        execution = next(self.executions)
        pb_utils.Logger.log_info(f"tbatch execution {execution}: {len(requests)} requests")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError(
                    f"negative input {x.ravel()[0]:g} in execution {execution}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            rows = x.shape[0]
            made = {
                "OUT": (x * 2).astype(self.out_dtype),
                "EXEC": np.full((rows, 1), execution, np.int64),
                "RID": np.full((rows, 1), request.request_id().encode(), object),
                "ARGS": np.full((rows, 1), self.args.encode(), object),
            }
            wanted = request.requested_output_names()
            tensors = [pb_utils.Tensor(n, made[n]) for n in wanted]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
"""

TBATCH_CONFIG = """
name: "tbatch"
backend: "python"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [
  { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "EXEC", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "RID", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "ARGS", data_type: TYPE_STRING, dims: [ 1 ] }
]
dynamic_batching { }
parameters { key: "greeting" value: { string_value: "hello" } }
parameters { key: "delay_ms" value: { string_value: "50" } }
"""

# Unbatched and broken on purpose: 0 -> too few responses, 1 -> execute raises,
# 2 -> something that is not an InferenceResponse, 3..6 and 8 -> an error response with a code.
TBROKEN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        if x[0] == 0:
            return []
        if x[0] == 1:
            raise pb_utils.TritonModelException("tbroken exploded")
        if x[0] == 2:
            return [None] * len(requests)
        codes = {
            3: pb_utils.TritonError.INVALID_ARG,
            4: pb_utils.TritonError.NOT_FOUND,
            5: pb_utils.TritonError.UNSUPPORTED,
            6: pb_utils.TritonError.UNAVAILABLE,
            8: pb_utils.TritonError.CANCELLED,
        }
        if int(x[0]) in codes:
            error = pb_utils.TritonError(f"{int(x[0])} is not allowed", codes[int(x[0])])
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]) for _ in requests]
"""

# Broken on purpose at request time: the automatic warm-up (which would refuse to load it)
# is turned off so the runtime errors can be seen.
TBROKEN_CONFIG = """
name: "tbroken"
backend: "python"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
parameters { key: "auto_warmup" value: { string_value: "false" } }
"""

# Writes a file at finalize; prints and logs at initialize.
TFINAL_PY = """
import json
from pathlib import Path
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.path = Path(config["parameters"]["finalize_path"]["string_value"])
        print(f"initialize: {config['name']} as {args['model_instance_name']}")
        pb_utils.Logger.log_warn("tfinal logger warning")

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
            for r in requests
        ]

    def finalize(self):
        self.path.write_text("finalized")
        print("finalize: done")
"""

TFINAL_CONFIG = """
name: "tfinal"
backend: "python"
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
parameters {{ key: "finalize_path" value: {{ string_value: "{path}" }} }}
"""


def _write_model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton_repo")
    shutil.copytree(EXAMPLES / "models" / "add_sub", repo / "add_sub")
    _write_model(repo, "tbatch", TBATCH_CONFIG, TBATCH_PY)
    _write_model(repo, "tbroken", TBROKEN_CONFIG, TBROKEN_PY)
    return repo


@pytest.fixture(scope="module")
def triton_server(triton_repo: Path) -> Iterator[RunningServer]:
    with run_server(triton_repo) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, triton_server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, triton_server)
    yield c
    c.raw.close()


def _status(client: Client, code: str) -> str:
    """The error status tritonclient reports: '500' over HTTP, 'StatusCode.INTERNAL' over gRPC."""
    return {"http": {"INTERNAL": "500"}}.get(client.protocol, {}).get(code, f"StatusCode.{code}")


def test_add_sub_example(client: Client) -> None:
    a = np.array([1.0, 2.5, -3.0, 4.0], np.float32)
    b = np.array([0.5, 0.5, 1.0, -4.0], np.float32)
    result = client.infer("add_sub", {"INPUT0": (a, "FP32"), "INPUT1": (b, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.float32


def test_add_sub_requested_output_only(client: Client) -> None:
    a = np.ones(4, np.float32)
    result = client.infer(
        "add_sub", {"INPUT0": (a, "FP32"), "INPUT1": (a, "FP32")}, outputs=["OUTPUT1"]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, np.float32))
    assert result.as_numpy("OUTPUT0") is None


def test_initialize_receives_tritons_args(client: Client, triton_repo: Path) -> None:
    x = np.array([[1.0]], np.float32)
    result = client.infer("tbatch", {"IN": (x, "FP32")}, outputs=["ARGS"])
    args = json.loads(result.as_numpy("ARGS")[0, 0])
    assert args == {
        "config_name": "tbatch",
        "max_batch_size": 8,
        "greeting": "hello",
        "instance_name": "tbatch_0_0",
        "kind": "CPU",
        "device_id": "0",
        "repository": str(triton_repo / "tbatch"),
        "version": "1",
        "model_name": "tbatch",
    }


def _infer_concurrently(client: Client, server: RunningServer, values: list[float]) -> list[Any]:
    """Send every value as its own request at once; each answer: a result or the exception."""
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    if client.protocol == "http":
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=len(values))
        pending = []
        for i, v in enumerate(values):
            inputs = client.inputs({"IN": (np.array([[v]], np.float32), "FP32")})
            pending.append(http.async_infer("tbatch", inputs, request_id=f"r{i}"))
        for i, p in enumerate(pending):
            try:
                answers.put((i, p.get_result(), None))
            except InferenceServerException as exc:
                answers.put((i, None, exc))
        http.close()
    else:
        for i, v in enumerate(values):
            inputs = client.inputs({"IN": (np.array([[v]], np.float32), "FP32")})
            client.raw.async_infer(
                "tbatch",
                inputs,
                lambda result, error, i=i: answers.put((i, result, error)),
                request_id=f"r{i}",
            )
    out: list[Any] = [None] * len(values)
    for _ in values:
        i, result, error = answers.get(timeout=30)
        out[i] = error if error is not None else result
    return out


def test_batched_requests_each_get_their_own_answer(
    client: Client, triton_server: RunningServer
) -> None:
    n = 32
    negative = {5, 13, 22, 30}
    values = [-float(i) if i in negative else float(i) for i in range(n)]
    answers = _infer_concurrently(client, triton_server, values)
    ok_executions: set[int] = set()
    failed_executions: set[int] = set()
    for i, answer in enumerate(answers):
        if i in negative:
            assert isinstance(answer, InferenceServerException), (i, answer)
            assert answer.status() == _status(client, "INTERNAL")
            assert f"negative input -{i} in execution" in answer.message()
            failed_executions.add(int(answer.message().rsplit(" ", 1)[1]))
        else:
            assert not isinstance(answer, Exception), (i, answer)
            np.testing.assert_array_equal(answer.as_numpy("OUT"), [[2.0 * i]])
            assert answer.as_numpy("RID")[0, 0] == f"r{i}".encode()
            ok_executions.add(int(answer.as_numpy("EXEC")[0, 0]))
    # The requests were batched, and a failed request did not fail its batch-mates.
    assert len(ok_executions | failed_executions) < n
    assert ok_executions & failed_executions


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0.0, ["execute() returned 0 responses for 1 requests", "one pb_utils.InferenceResponse"]),
        (1.0, ["tbroken exploded"]),
        (2.0, ["execute() returned NoneType for a request", "pb_utils.InferenceResponse"]),
    ],
    ids=["too few responses", "execute raises", "not a response"],
)
def test_broken_execute_fails_with_a_clear_message(
    client: Client, value: float, words: list[str]
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("tbroken", {"IN": (np.array([value], np.float32), "FP32")})
    assert info.value.status() == _status(client, "INTERNAL"), info.value.message()
    assert "model 'tbroken'" in info.value.message()
    for word in words:
        assert word in info.value.message()
    # The model keeps serving.
    result = client.infer("tbroken", {"IN": (np.array([7.0], np.float32), "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUT"), [7.0])


@pytest.mark.parametrize(
    ("value", "http", "grpc"),
    [
        (3.0, "400", "INVALID_ARGUMENT"),
        (4.0, "404", "NOT_FOUND"),
        (5.0, "400", "INVALID_ARGUMENT"),
        (6.0, "503", "UNAVAILABLE"),
        (8.0, "500", "INTERNAL"),
    ],
    ids=["INVALID_ARG", "NOT_FOUND", "UNSUPPORTED", "UNAVAILABLE", "CANCELLED"],
)
def test_an_error_codes_status_follows_triton(
    client: Client, value: float, http: str, grpc: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("tbroken", {"IN": (np.array([value], np.float32), "FP32")})
    expected = http if client.protocol == "http" else f"StatusCode.{grpc}"
    assert info.value.status() == expected
    assert f"{int(value)} is not allowed" in info.value.message()


def test_logger_goes_to_the_models_log(
    triton_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    c = Client("grpc", triton_server)
    with caplog.at_level("INFO", logger="inferd.model.tbatch"):
        c.infer("tbatch", {"IN": (np.array([[3.0]], np.float32), "FP32")})
    c.raw.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "inferd.model.tbatch"]
    assert any(line.startswith("tbatch execution ") for line in lines), lines


def test_initialize_and_finalize_run_around_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = tmp_path / "repo"
    marker = tmp_path / "finalized.txt"
    _write_model(repo, "tfinal", TFINAL_CONFIG.format(path=marker), TFINAL_PY)
    with caplog.at_level("INFO", logger="inferd.model.tfinal"), run_server(repo) as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        inp = grpcclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.array([4.0], np.float32))
        np.testing.assert_array_equal(client.infer("tfinal", [inp]).as_numpy("IN"), [4.0])
        client.close()
        assert not marker.exists()
    assert marker.read_text() == "finalized"
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("INFO", "initialize: tfinal as tfinal_0_0") in records
    assert ("WARNING", "tfinal logger warning") in records
    assert ("INFO", "finalize: done") in records
