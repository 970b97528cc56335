"""Python models behave as on Triton's Python backend, in the server process and in a worker
process of their own (`isolation: "process"`), over HTTP and gRPC with Triton's clients:

- request parameters reach `request.parameters()` (Triton's reserved ones left out) and
  inferd's `predict(inputs, requests)` (`RequestInfo.parameters`), and a bad one is a 400;
- `async def execute` / `async def predict` run on the instance's own event loop;
- `InferenceResponse(parameters=...)` reach the client's response;
- `request.timeout()` and `request.is_cancelled()` say what the client asked and did;
- `is_ready()` decides what the readiness endpoints answer;
- model.py imports modules shipped beside it, as with Triton;
- a decoupled model's `async def execute` is not waited for (Triton's rule), and a decoupled
  TritonPythonModel with isolation process is refused naming it.
"""

from __future__ import annotations

import json
import queue
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

ISOLATIONS = ["thread", "process"]

# Batched, async: OUT = IN * FACTOR (from helpers.py beside model.py); PARAMS, TIMEOUT and
# THREAD say what the model saw and where it ran; the response carries parameters.
TPARAMS_PY = """
import asyncio, json, threading
import numpy as np
import triton_python_backend_utils as pb_utils
from helpers import FACTOR

class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0.001)
        thread = threading.current_thread().name
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            rows = x.shape[0]
            made = {
                "OUT": x * FACTOR,
                "PARAMS": np.full((rows, 1), request.parameters().encode(), object),
                "TIMEOUT": np.full((rows, 1), request.timeout(), np.int64),
                "THREAD": np.full((rows, 1), thread.encode(), object),
            }
            tensors = [pb_utils.Tensor(n, made[n]) for n in request.requested_output_names()]
            answer = {"answered_by": "tparams", "rows": rows, "big": rows > 1}
            responses.append(pb_utils.InferenceResponse(tensors, parameters=answer))
        return responses
"""

TPARAMS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "PARAMS", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "TIMEOUT", data_type: TYPE_INT64, dims: [ 1 ] }},
  {{ name: "THREAD", data_type: TYPE_STRING, dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
{extra}
"""

# inferd's API, async, reading parameters: OUT = IN * its request's own `scale`; ROWS: how
# many rows the batch had (to see that requests with different parameters were batched).
MPARAMS_PY = """
import asyncio
import numpy as np

class Model:
    async def predict(self, inputs, requests):
        await asyncio.sleep(0.02)
        x = inputs["IN"]
        scale = np.concatenate([
            np.full((r.rows, 1), float(r.parameters.get("scale", 1)), np.float32)
            for r in requests
        ])
        return {"OUT": x * scale, "ROWS": np.full((x.shape[0], 1), x.shape[0], np.int64)}
"""

MPARAMS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "ROWS", data_type: TYPE_INT64, dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 50000 }}
{extra}
"""

# Waits for its client to give up, then writes what is_cancelled() said to MARKER_DIR/<id>.
TCANCEL_PY = """
import json, time
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.markers = Path(config["parameters"]["marker_dir"]["string_value"])

    def execute(self, requests):
        request = requests[0]
        deadline = time.monotonic() + 10
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = "cancelled" if request.is_cancelled() else "never cancelled"
        partial = self.markers / (request.request_id() + ".partial")
        partial.write_text(seen)
        partial.replace(self.markers / request.request_id())  # the test never reads it half-written
        x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)])]
"""

# Ready while the flag file exists.
TREADY_PY = """
import json
from pathlib import Path
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.flag = Path(config["parameters"]["ready_flag"]["string_value"])

    async def is_ready(self):
        return self.flag.exists()

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
            for r in requests
        ]
"""

SIMPLE_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "{out}", data_type: TYPE_FP32, dims: [ 1 ] }} ]
parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}
parameters {{ key: "auto_warmup" value: {{ string_value: "false" }} }}
{extra}
"""

PROCESS = 'parameters { key: "isolation" value: { string_value: "process" } }'


def _write(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("parity")
    markers = base / "markers"
    markers.mkdir()
    return {"repo": base / "repo", "markers": markers, "flags": base}


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[RunningServer]:
    repo = paths["repo"]
    for iso in ISOLATIONS:
        extra = PROCESS if iso == "process" else ""
        _write(
            repo,
            f"tparams_{iso}",
            TPARAMS_CONFIG.format(name=f"tparams_{iso}", extra=extra),
            TPARAMS_PY,
        )
        (repo / f"tparams_{iso}" / "1" / "helpers.py").write_text("FACTOR = 2\n")
        _write(
            repo,
            f"mparams_{iso}",
            MPARAMS_CONFIG.format(name=f"mparams_{iso}", extra=extra),
            MPARAMS_PY,
        )
        for protocol in PROTOCOLS:  # one each: a slow execution sets no one else's estimate
            name = f"tcancel_{iso}_{protocol}"
            cancel = SIMPLE_CONFIG.format(
                name=name, out="OUT", key="marker_dir", value=paths["markers"], extra=extra
            )
            _write(repo, name, cancel, TCANCEL_PY)
        flag = paths["flags"] / f"ready_{iso}"
        flag.touch()
        ready = SIMPLE_CONFIG.format(
            name=f"tready_{iso}", out="IN", key="ready_flag", value=flag, extra=extra
        )
        _write(repo, f"tready_{iso}", ready, TREADY_PY)
    with run_server(repo) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.raw.close()


def _response_parameters(client: Client, result: Any) -> dict[str, Any]:
    if client.protocol == "http":
        return dict(result.get_response().get("parameters", {}))
    params = result.get_response().parameters
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in params.items()}


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_request_parameters_reach_the_triton_model(client: Client, iso: str) -> None:
    x = np.array([[1.5], [2.0]], np.float32)
    result = client.infer(
        f"tparams_{iso}",
        {"IN": (x, "FP32")},
        outputs=["OUT", "PARAMS", "TIMEOUT", "THREAD"],
        parameters={"mode": "fast", "n": 3, "flag": True, "ratio": 0.5},
        priority=1,
        timeout=5_000_000,
    )
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2)  # helpers.FACTOR
    seen = json.loads(result.as_numpy("PARAMS")[0, 0])
    # Triton's reserved keys (priority, timeout) are the server's, not the model's.
    assert seen == {"mode": "fast", "n": 3, "flag": True, "ratio": 0.5}
    assert result.as_numpy("TIMEOUT")[0, 0] == 5_000_000
    # async def execute ran on the instance's own event loop, not the server's.
    assert result.as_numpy("THREAD")[0, 0].decode().endswith("-async")
    assert _response_parameters(client, result) == {
        "answered_by": "tparams",
        "rows": 2,
        "big": True,
    }


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_a_request_without_parameters_sees_an_empty_object(client: Client, iso: str) -> None:
    result = client.infer(
        f"tparams_{iso}", {"IN": (np.ones((1, 1), np.float32), "FP32")}, outputs=["PARAMS"]
    )
    assert result.as_numpy("PARAMS")[0, 0] == b"{}"


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_each_row_gets_its_own_requests_parameters(client: Client, iso: str) -> None:
    model = f"mparams_{iso}"
    answers: queue.Queue[tuple[float, Any]] = queue.Queue()
    scales = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    if client.protocol == "http":
        import tritonclient.http as httpclient

        raw = httpclient.InferenceServerClient(client.raw._parsed_url.netloc, concurrency=6)
        pending = [
            (
                s,
                raw.async_infer(
                    model,
                    client.inputs({"IN": (np.array([[10.0]], np.float32), "FP32")}),
                    parameters={"scale": s},
                ),
            )
            for s in scales
        ]
        for s, p in pending:
            answers.put((s, p.get_result()))
        raw.close()
    else:
        for s in scales:
            client.raw.async_infer(
                model,
                client.inputs({"IN": (np.array([[10.0]], np.float32), "FP32")}),
                lambda result, error, s=s: answers.put((s, error or result)),
                parameters={"scale": s},
            )
    batch_rows = []
    for _ in scales:
        scale, result = answers.get(timeout=30)
        assert not isinstance(result, Exception), result
        assert result.as_numpy("OUT")[0, 0] == 10.0 * scale
        batch_rows.append(int(result.as_numpy("ROWS")[0, 0]))
    # Requests with different parameters still shared a batch.
    assert max(batch_rows) > 1, batch_rows


def _raw_grpc_infer(server: RunningServer, model: str, set_parameter: Any) -> grpc.RpcError:
    channel = grpc.insecure_channel(server.grpc_address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="IN", datatype="FP32", shape=[1, 1])
    req.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    set_parameter(req.parameters)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req, timeout=30)
    channel.close()
    return info.value


@pytest.mark.parametrize("iso", ISOLATIONS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_parameter_a_model_cannot_take_is_a_400(
    server: RunningServer, protocol: str, iso: str
) -> None:
    model = f"tparams_{iso}"
    if protocol == "http":
        body = {
            "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}],
            "parameters": {"shape_hint": [1, 2]},
        }
        with server.client() as c:
            response = c.post(f"/v2/models/{model}/infer", json=body)
        assert response.status_code == 400, response.text
        message = response.json()["error"]
    else:
        error = _raw_grpc_infer(server, model, lambda p: p["shape_hint"].SetInParent())
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        message = str(error.details())
    assert "request parameter 'shape_hint'" in message
    assert "string, number or boolean" in message


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_is_cancelled_sees_the_client_give_up(
    client: Client, paths: dict[str, Path], iso: str
) -> None:
    request_id = f"{client.protocol}-{iso}"
    deadline = (
        {"client_timeout": 0.5}
        if client.protocol == "grpc"
        else {"headers": {"inferd-timeout-ms": "500"}}
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            f"tcancel_{iso}_{client.protocol}",
            {"IN": (np.ones(1, np.float32), "FP32")},
            request_id=request_id,
            **deadline,
        )
    assert "deadline" in info.value.message().lower()
    marker = paths["markers"] / request_id
    give_up = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < give_up, "the model never finished its execution"
        time.sleep(0.02)
    assert marker.read_text() == "cancelled"


def _model_ready(client: Client, model: str) -> bool:
    return bool(client.raw.is_model_ready(model))


@pytest.mark.parametrize("iso", ISOLATIONS)
def test_is_ready_decides_readiness(
    client: Client, server: RunningServer, paths: dict[str, Path], iso: str
) -> None:
    model, flag = f"tready_{iso}", paths["flags"] / f"ready_{iso}"

    def becomes(wanted: bool) -> None:
        # A probe answers with the latest is_ready() and starts the next one.
        give_up = time.monotonic() + 30
        while _model_ready(client, model) is not wanted:
            assert time.monotonic() < give_up, f"{model} never read ready={wanted}"
            time.sleep(0.02)

    flag.touch()
    becomes(True)
    flag.unlink()
    try:
        becomes(False)
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=30).status_code == 503
        # Not ready is about probes: requests are still served, as with Triton.
        result = client.infer(model, {"IN": (np.ones(1, np.float32), "FP32")})
        np.testing.assert_array_equal(result.as_numpy("IN"), [1.0])
    finally:
        flag.touch()
    becomes(True)


# Decoupled and async: the first request's coroutine waits until a second one has started,
# which only happens if the instance took the next batch while the first was still running.
TASYNC_STREAM_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.started = 0
        self.second = None

    async def execute(self, requests):
        self.started += 1
        if self.second is None:
            self.second = asyncio.Event()
        if self.started >= 2:
            self.second.set()
        try:
            await asyncio.wait_for(self.second.wait(), timeout=20)
            overlapped = 1
        except asyncio.TimeoutError:
            overlapped = 0
        for request in requests:
            out = pb_utils.Tensor("OUT", np.array([overlapped], np.float32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
"""

DECOUPLED_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
parameters {{ key: "auto_warmup" value: {{ string_value: "false" }} }}
{extra}
"""


def test_an_async_decoupled_execute_is_not_waited_for(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    _write(tmp_path, "tasync", DECOUPLED_CONFIG.format(name="tasync", extra=""), TASYNC_STREAM_PY)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with run_server(tmp_path) as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for i in range(2):
                inp = grpcclient.InferInput("IN", [1], "FP32")
                inp.set_data_from_numpy(np.zeros(1, np.float32))
                client.async_stream_infer("tasync", [inp], request_id=f"r{i}")
            seen = {}
            for _ in range(2):
                result, error = answers.get(timeout=60)
                assert error is None, error
                seen[result.get_response().id] = float(result.as_numpy("OUT")[0])
        finally:
            client.stop_stream()
            client.close()
    # Both coroutines ran at once on the instance's loop (one instance, two executions).
    assert seen == {"r0": 1.0, "r1": 1.0}


def test_a_decoupled_triton_model_with_isolation_process_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path, "tproc", DECOUPLED_CONFIG.format(name="tproc", extra=PROCESS), TASYNC_STREAM_PY
    )
    with run_server(tmp_path) as server, server.client() as c:
        rows = {row["name"]: row for row in c.post("/v2/repository/index").json()}
    assert rows["tproc"]["state"] == "UNAVAILABLE"
    assert "a decoupled TritonPythonModel runs in the server process" in rows["tproc"]["reason"]
