"""Decoupled models: zero or more responses per request, then the final flag.

One case table, run over gRPC ModelStreamInfer (Triton's own client: `start_stream`,
`async_stream_infer`) and HTTP generate_stream (server-sent events, parsed here), against the
same model written twice: in Triton's style (`request.get_response_sender()`) and with
inferd's `predict_stream(inputs, responses)` (tests/stream_models.py).
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import STATE_DEADLINE_S, RunningServer, batcher_of, run_server, wait_for
from tests.stream_models import (
    DROPPED_AFTER_CANCEL,
    REPEAT_CONFIG,
    REPEAT_INFERD_PY,
    REPEAT_MODELS,
    write_model,
    write_stream_models,
)

MODELS = list(REPEAT_MODELS)
PROTOCOLS = ["grpc", "http"]


@dataclass
class Stream:
    """What one request's stream brought: each response's (OUT, IDX), errors in place as
    ("error", message), and whether the last item carried the final flag."""

    items: list[tuple[Any, Any]] = field(default_factory=list)
    final_flags: list[bool] = field(default_factory=list)

    @property
    def outs(self) -> list[int]:
        return [out for out, _ in self.items if out != "error"]


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("stream_repo")
    write_stream_models(repo, markers)
    with run_server(repo) as running:
        yield running


def grpc_inputs(values: dict[str, int]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value in values.items():
        inp = grpcclient.InferInput(name, [1], "INT32")
        inp.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(inp)
    return inputs


class GrpcStream:
    """One gRPC ModelStreamInfer call with tritonclient; answers collected per request id."""

    def __init__(self, server: RunningServer) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_address)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, request_id: str, empty_final: bool = True, **values: int) -> None:
        self.client.async_stream_infer(
            model,
            grpc_inputs(values),
            request_id=request_id,
            enable_empty_final_response=empty_final,
        )

    def next(self) -> tuple[Any, Any]:
        return self.answers.get(timeout=STATE_DEADLINE_S)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def grpc_collect(
    stream: GrpcStream, expected_finals: int, final_errors: bool = False
) -> dict[str, Stream]:
    """Read until `expected_finals` requests have had their final response. tritonclient
    hands an error over without its response (no id, no final flag): errors are only used
    with one request in flight, and `final_errors` says that an error ends it."""
    streams: dict[str, Stream] = {}
    finals = 0
    last = ""
    while finals < expected_finals:
        result, error = stream.next()
        if error is not None:
            streams.setdefault(last, Stream()).items.append(("error", str(error)))
            finals += final_errors
            continue
        response = result.get_response()
        last = response.id
        s = streams.setdefault(response.id, Stream())
        final = response.parameters["triton_final_response"].bool_param
        s.final_flags.append(final)
        if response.outputs:
            s.items.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        finals += final
    return streams


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Server-sent events as the spec frames them: `data:` lines, a blank line ends one."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []
    if data:
        yield json.loads("\n".join(data))


def http_stream(server: RunningServer, model: str, **values: int) -> Stream:
    with (
        server.client() as client,
        client.stream("POST", f"/v2/models/{model}/generate_stream", json=values) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        s = Stream()
        for event in sse_events(r.iter_lines()):
            if "error" in event:
                s.items.append(("error", event["error"]))
            else:
                assert event["model_name"] == model and event["model_version"] == "1"
                s.items.append((event["OUT"], event["IDX"]))
        return s


def one_stream(
    protocol: str, server: RunningServer, model: str, final_errors: bool = False, **values: int
) -> Stream:
    if protocol == "http":
        return http_stream(server, model, **values)
    stream = GrpcStream(server)
    try:
        stream.send(model, "r", **values)
        return grpc_collect(stream, 1, final_errors).get("r", Stream())
    finally:
        stream.close()


# -- N responses in order, then the final flag ------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("n", [0, 1, 5])
def test_n_responses_in_order_then_final(
    server: RunningServer, protocol: str, model: str, n: int
) -> None:
    s = one_stream(protocol, server, model, N=n, TAG=3)
    assert s.items == [(3000 + i, i) for i in range(n)]
    if protocol == "grpc":
        # Every response says whether it is the last; with none, an empty final response
        # (enable_empty_final_response) carries the flag.
        assert s.final_flags == ([False] * (n - 1) + [True] if n else [True])


def test_grpc_final_flag_alone_is_sent_only_when_asked(server: RunningServer) -> None:
    stream = GrpcStream(server)
    try:
        stream.send("repeat_triton", "silent", empty_final=False, N=0, TAG=1)
        stream.send("repeat_triton", "after", empty_final=False, N=1, TAG=2)
        result, error = stream.next()
    finally:
        stream.close()
    assert error is None
    assert result.get_response().id == "after"  # nothing at all for "silent"
    assert int(result.as_numpy("OUT")[0]) == 2000


@pytest.mark.parametrize("model", MODELS)
def test_grpc_concurrent_requests_on_one_stream_are_not_mixed(
    server: RunningServer, model: str
) -> None:
    stream = GrpcStream(server)
    try:
        for tag in range(1, 7):
            stream.send(model, f"t{tag}", N=20, TAG=tag)
        streams = grpc_collect(stream, 6)
    finally:
        stream.close()
    assert sorted(streams) == [f"t{tag}" for tag in range(1, 7)]
    for tag in range(1, 7):
        assert streams[f"t{tag}"].items == [(tag * 1000 + i, i) for i in range(20)]


@pytest.mark.parametrize("model", MODELS)
def test_http_concurrent_streams_are_not_mixed(server: RunningServer, model: str) -> None:
    results: dict[int, Stream] = {}

    def run(tag: int) -> None:
        results[tag] = http_stream(server, model, N=20, TAG=tag)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(STATE_DEADLINE_S)
    assert sorted(results) == list(range(1, 7))
    for tag, s in results.items():
        assert s.items == [(tag * 1000 + i, i) for i in range(20)]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_error_response_mid_stream_does_not_end_it(
    server: RunningServer, protocol: str, model: str
) -> None:
    s = one_stream(protocol, server, model, N=4, TAG=5, FAIL_AT=1)
    assert [out for out, _ in s.items] == [5000, "error", 5002, 5003]
    assert f"model '{model}': failed at 1" in s.items[1][1]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_raising_mid_stream_ends_it_with_the_error(
    server: RunningServer, protocol: str, model: str
) -> None:
    s = one_stream(protocol, server, model, final_errors=True, N=5, TAG=6, RAISE_AT=2)
    assert [out for out, _ in s.items] == [6000, 6001, "error"]
    assert f"model '{model}': raised at 2" in s.items[2][1]
    # The server and the model still serve.
    assert one_stream(protocol, server, model, N=1, TAG=6).items == [(6000, 0)]


@pytest.mark.parametrize("model", MODELS)
def test_an_error_before_any_response_is_the_requests_error(
    server: RunningServer, model: str
) -> None:
    with server.client() as client:
        raised = client.post(
            f"/v2/models/{model}/generate_stream", json={"N": 3, "TAG": 1, "RAISE_AT": 0}
        )
        assert raised.status_code == 500
        assert raised.headers["content-type"] == "application/json"
        assert f"model '{model}': raised at 0" in raised.json()["error"]
        missing = client.post(f"/v2/models/{model}/generate_stream", json={"N": 3})
        assert missing.status_code == 400
        assert f"missing input 'TAG' for model '{model}'" in missing.json()["error"]
        unknown = client.post("/v2/models/nope/generate_stream", json={"N": 3})
        assert unknown.status_code == 404


def test_unary_infer_to_a_decoupled_model_gets_tritons_error(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{server.port}") as client:
        inputs = []
        for name in ("N", "TAG"):
            inp = httpclient.InferInput(name, [1], "INT32")
            inp.set_data_from_numpy(np.array([1], np.int32))
            inputs.append(inp)
        with pytest.raises(InferenceServerException) as http_error:
            client.infer("repeat_triton", inputs)
    assert http_error.value.status() == "400"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(
        http_error.value
    )
    assert "generate_stream" in str(http_error.value)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc_client.infer("repeat_triton", grpc_inputs({"N": 1, "TAG": 1}))
    grpc_client.close()
    assert grpc_error.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(
        grpc_error.value
    )


# -- generate: one response -------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_generate_answers_the_one_response(server: RunningServer, model: str) -> None:
    with server.client() as client:
        r = client.post(f"/v2/models/{model}/generate", json={"N": 1, "TAG": 4})
        assert r.status_code == 200, r.text
        assert r.json() == {"model_name": model, "model_version": "1", "OUT": 4000, "IDX": 0}
        for n, got in ((0, "no response"), (3, "more than one response")):
            r = client.post(f"/v2/models/{model}/versions/1/generate", json={"N": n, "TAG": 4})
            assert r.status_code == 400
            assert "exactly 1 response" in r.json()["error"] and got in r.json()["error"]
            assert "generate_stream" in r.json()["error"]


def test_generate_serves_a_model_that_is_not_decoupled(server: RunningServer) -> None:
    with server.client() as client:
        r = client.post("/v2/models/upper/generate", json={"text_input": "hello"})
        assert r.status_code == 200, r.text
        assert r.json() == {"model_name": "upper", "model_version": "1", "text_output": "HELLO"}
        body = {"parameters": {"text_input": "nested"}}  # inputs may also sit in parameters
        with client.stream("POST", "/v2/models/upper/generate_stream", json=body) as s:
            events = list(sse_events(s.iter_lines()))
        assert events == [{"model_name": "upper", "model_version": "1", "text_output": "NESTED"}]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"text_input": ["a", "b"]}, ["input 'text_input'", "2 elements", "[1]"]),
        ({"text_input": [["a"]]}, ["input 'text_input'", "flat list"]),
        ({"text_input": "a", "extra": {"x": 1}}, ["'extra'", "string, number or boolean"]),
        ({"temperature": 0.5}, ["names none of model 'upper''s inputs", "text_input"]),
        ({"text_input": 3}, ["input 'text_input'", "BYTES data must be strings"]),
        ({"text_input": "a", "priority": "high"}, ["'priority'", "integer >= 0"]),
    ],
)
def test_generate_refuses_what_it_cannot_map(
    server: RunningServer, body: dict[str, Any], words: list[str]
) -> None:
    with server.client() as client:
        r = client.post("/v2/models/upper/generate", json=body)
    assert r.status_code == 400, r.text
    for word in words:
        assert word in r.json()["error"]


# -- cancellation -----------------------------------------------------------------------------


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.005)


def stats(server: RunningServer, model: str) -> dict[str, Any]:
    with server.client() as client:
        doc: dict[str, Any] = client.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return doc


def metric(server: RunningServer, name: str, model: str) -> float:
    text = httpx.get(server.metrics_url).text
    prefix = f'{name}{{model="{model}",version="1"'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def wait_for_count(server: RunningServer, model: str, key: str, count: int) -> dict[str, Any]:
    """The model's statistics once inference_stats[key] reached `count`."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while True:
        doc = stats(server, model)
        if doc["inference_stats"][key]["count"] >= count:
            return doc
        assert time.monotonic() < deadline, f"{key} did not reach {count}: {doc}"
        time.sleep(0.005)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_that_leaves_cancels_the_stream(
    server: RunningServer, markers: Path, protocol: str, model: str
) -> None:
    tag = 100 + PROTOCOLS.index(protocol) * 10 + MODELS.index(model)
    before = stats(server, model)["inference_stats"]["fail"]["count"]
    dropped_before = metric(server, "inferd_stream_responses_dropped_total", model)
    if protocol == "grpc":
        stream = GrpcStream(server)
        stream.send(model, "leaving", N=-1, TAG=tag)
        result, error = stream.next()
        assert error is None and int(result.as_numpy("OUT")[0]) == tag * 1000
        stream.close(cancel=True)
    else:
        with (
            server.client() as client,
            client.stream(
                "POST", f"/v2/models/{model}/generate_stream", json={"N": -1, "TAG": tag}
            ) as r,
        ):
            first = next(sse_events(r.iter_lines()))
            assert first["OUT"] == tag * 1000
        # Leaving the block closed the connection mid-stream.
    # The model sees is_cancelled() turn true inside its loop...
    wait_for_file(markers / f"cancelled-{tag}")
    # ...and its later sends are dropped and counted; the request counts once, cancelled.
    doc = wait_for_count(server, model, "fail", before + 1)
    assert doc["inference_stats"]["fail"]["count"] == before + 1
    assert doc["response_stats"]["0"]["success"]["count"] >= 1
    deadline = time.monotonic() + STATE_DEADLINE_S
    while metric(server, "inferd_stream_responses_dropped_total", model) < (
        dropped_before + DROPPED_AFTER_CANCEL
    ):
        assert time.monotonic() < deadline, "the dropped responses were not counted"
        time.sleep(0.005)
    assert metric(server, "inferd_stream_responses_dropped_total", model) == (
        dropped_before + DROPPED_AFTER_CANCEL
    )
    # The model was not failed: it serves the next request.
    assert one_stream(protocol, server, model, N=2, TAG=tag).outs == [tag * 1000, tag * 1000 + 1]


# -- statistics and metrics -------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_a_stream_counts_once_with_its_responses(server: RunningServer, model: str) -> None:
    before = stats(server, model)
    sent_before = metric(server, "inferd_stream_responses_total", model)
    success_before = before["inference_stats"]["success"]["count"]

    def position(doc: dict[str, Any], key: str, kind: str) -> int:
        count: int = doc["response_stats"].get(key, {}).get(kind, {}).get("count", 0)
        return count

    assert one_stream("grpc", server, model, N=3, TAG=9).outs == [9000, 9001, 9002]
    assert one_stream("http", server, model, N=0, TAG=9).items == []
    after = wait_for_count(server, model, "success", success_before + 2)
    assert after["inference_stats"]["success"]["count"] == success_before + 2
    assert after["inference_stats"]["queue"]["count"] == success_before + 2
    for key in ("0", "1", "2"):
        assert position(after, key, "success") == position(before, key, "success") + 1
    # N = 0: the final flag alone, at position 0.
    assert position(after, "0", "empty_response") == position(before, "0", "empty_response") + 1
    assert metric(server, "inferd_stream_responses_total", model) == sent_before + 3
    assert metric(server, "inferd_request_success_total", model) >= 2


# -- what a decoupled model must do -----------------------------------------------------------

NO_FINAL_PY = """
import triton_python_backend_utils as pb_utils
import numpy as np

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if x[0] == 1:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
            elif x[0] == 2:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif x[0] == 3:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)])]
        return None
"""

NO_FINAL_CONFIG = """
name: "careless"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
parameters { key: "auto_warmup" value: { string_value: "false" } }
"""


@pytest.fixture(scope="module")
def warnings() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("inferd.backends.python")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def careless(
    tmp_path_factory: pytest.TempPathFactory, warnings: list[logging.LogRecord]
) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("careless_repo")
    write_model(repo, "careless", NO_FINAL_PY, NO_FINAL_CONFIG)
    with run_server(repo) as running:
        yield running


def careless_events(server: RunningServer, value: float) -> list[dict[str, Any]]:
    with (
        server.client() as client,
        client.stream("POST", "/v2/models/careless/generate_stream", json={"IN": value}) as r,
    ):
        if r.status_code != 200:
            return [{"status": r.status_code, **json.loads(r.read())}]
        return list(sse_events(r.iter_lines()))


def test_a_model_that_drops_its_sender_without_the_final_flag(careless: RunningServer) -> None:
    # The client is not left waiting: the stream ends with an error naming the mistake.
    events = careless_events(careless, 1)
    assert events[0]["OUT"] == 1
    assert (
        "released the request's response sender without sending the final flag"
        in (events[1]["error"])
    )
    nothing = careless_events(careless, 0)
    assert nothing[0]["status"] == 500
    assert "without sending the final flag" in nothing[0]["error"]


def test_a_decoupled_model_breaking_the_contract_fails_loudly(
    careless: RunningServer, warnings: list[logging.LogRecord]
) -> None:
    # Sending after the final flag raises in the model (Triton's message): the client had
    # its stream's end already, so the log says what went wrong.
    assert careless_events(careless, 2) == []
    assert_warned(warnings, "Unable to send response. Response sender has been closed.")
    # Returning responses from execute: refused, after the one response it sent.
    returned = careless_events(careless, 3)
    assert returned == [{"model_name": "careless", "model_version": "1", "OUT": 3.0}]
    assert_warned(warnings, "execute() returned list; a decoupled model")
    with careless.client() as client:
        assert client.get("/v2/health/ready").status_code == 200


def assert_warned(records: list[logging.LogRecord], words: str) -> None:
    """The warning is logged in the model's thread, which may end after the client's read."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not any(words in r.getMessage() for r in records):
        assert time.monotonic() < deadline, f"no warning with {words!r}"
        time.sleep(0.005)


def test_what_cannot_run_decoupled_fails_the_load(tmp_path: Path) -> None:
    isolated = REPEAT_CONFIG.format(name="isolated", marker_dir=tmp_path) + (
        'parameters { key: "isolation" value: { string_value: "process" } }\n'
    )
    write_model(tmp_path, "isolated", REPEAT_INFERD_PY, isolated)
    no_stream = REPEAT_CONFIG.format(name="no_stream", marker_dir=tmp_path)
    write_model(
        tmp_path, "no_stream", "class Model:\n    def predict(self, inputs): ...\n", no_stream
    )
    with run_server(tmp_path) as running, running.client() as client:
        index = {row["name"]: row for row in client.post("/v2/repository/index").json()}
    assert index["isolated"]["state"] == "UNAVAILABLE"
    reason = index["isolated"]["reason"]
    assert "isolated/config.pbtxt" in reason and 'isolation "process"' in reason
    assert "decoupled" in reason
    assert index["no_stream"]["state"] == "UNAVAILABLE"
    assert "must define Model.predict_stream(inputs, responses)" in index["no_stream"]["reason"]


# -- with the batcher: batched together, each on its own stream; leaving the queue --------

# Batched, one instance. Each execution appends its requests' tags to `record_path`; one that
# holds TAG 1 waits while `gate_path` exists (a minute at most), holding the instance so that
# the requests behind it queue up. Each request gets N responses: OUT and BATCH (the number
# of requests its execution held).
BATCHED_PY = """
import json, os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.gate = params["gate_path"]["string_value"]
        self.record = params["record_path"]["string_value"]

    def execute(self, requests):
        def get(request, name):
            return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0, 0])

        tags = [get(r, "TAG") for r in requests]
        if any(tags):  # not the warm-up's zeros
            with open(self.record, "a") as f:
                f.write(" ".join(map(str, tags)) + "\\n")
        give_up = time.monotonic() + 60
        while 1 in tags and os.path.exists(self.gate) and time.monotonic() < give_up:
            threading.Event().wait(0.002)
        for request, tag in zip(requests, tags):
            n = get(request, "N")
            sender = request.get_response_sender()
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([[tag * 1000 + i]], np.int32))
                size = pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32))
                flags = FINAL if i == n - 1 else 0
                sender.send(pb_utils.InferenceResponse([out, size]), flags=flags)
            if n == 0:
                sender.send(flags=FINAL)
        return None
"""

BATCHED_CONFIG = """
name: "repeat_batched"
backend: "python"
max_batch_size: 8
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "TAG", data_type: TYPE_INT32, dims: [ 1 ] }}
]
output [
  {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] }}
]
dynamic_batching {{ }}
parameters {{ key: "gate_path" value: {{ string_value: "{gate}" }} }}
parameters {{ key: "record_path" value: {{ string_value: "{record}" }} }}
"""


@dataclass
class Batched:
    server: RunningServer
    gate: Path
    record: Path

    def executions(self) -> list[list[int]]:
        if not self.record.exists():
            return []
        return [[int(t) for t in line.split()] for line in self.record.read_text().splitlines()]

    def stream(self, tag: int, n: int, into: dict[int, list[dict[str, Any]]]) -> None:
        with (
            self.server.client() as client,
            client.stream(
                "POST", "/v2/models/repeat_batched/generate_stream", json={"N": n, "TAG": tag}
            ) as r,
        ):
            into[tag] = list(sse_events(r.iter_lines()))

    def hold(self) -> tuple[threading.Thread, dict[int, list[dict[str, Any]]]]:
        """The instance busy with TAG 1, behind the gate, until the gate is removed."""
        self.gate.touch()
        self.record.unlink(missing_ok=True)
        held: dict[int, list[dict[str, Any]]] = {}
        blocker = threading.Thread(target=self.stream, args=(1, 1, held))
        blocker.start()
        deadline = time.monotonic() + STATE_DEADLINE_S
        while self.executions() != [[1]]:
            assert time.monotonic() < deadline, "the blocker did not start executing"
            time.sleep(0.002)
        return blocker, held


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Batched]:
    repo = tmp_path_factory.mktemp("batched_repo")
    state = tmp_path_factory.mktemp("batched_state")
    gate, record = state / "gate", state / "record"
    write_model(repo, "repeat_batched", BATCHED_PY, BATCHED_CONFIG.format(gate=gate, record=record))
    with run_server(repo) as running:
        yield Batched(running, gate, record)
        gate.unlink(missing_ok=True)


def test_requests_batched_together_each_get_their_own_stream(batched: Batched) -> None:
    blocker, results = batched.hold()
    threads = [threading.Thread(target=batched.stream, args=(tag, 3, results)) for tag in (2, 3, 4)]
    for t in threads:
        t.start()
    wait_for(batcher_of(batched.server, "repeat_batched"), lambda b: b.queue_depth() == 3, "3")
    batched.gate.unlink()
    for t in [blocker, *threads]:
        t.join(STATE_DEADLINE_S)
    # The three queued ones (in whichever order they arrived): one execution.
    assert [sorted(tags) for tags in batched.executions()] == [[1], [2, 3, 4]]
    for tag in (2, 3, 4):
        assert [(e["OUT"], e["BATCH"]) for e in results[tag]] == [
            (tag * 1000 + i, 3) for i in range(3)
        ]


def test_a_request_whose_client_leaves_the_queue_never_executes(batched: Batched) -> None:
    blocker, _ = batched.hold()
    failed_before = stats(batched.server, "repeat_batched")["inference_stats"]["fail"]["count"]
    body = json.dumps({"N": 1, "TAG": 5}).encode()
    with socket.create_connection(("127.0.0.1", batched.server.port)) as sock:
        sock.sendall(
            b"POST /v2/models/repeat_batched/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_for(
            batcher_of(batched.server, "repeat_batched"), lambda b: b.queue_depth() == 1, "queued"
        )
    # Gone while queued: counted at once (cancelled), while the blocker still runs...
    doc = wait_for_count(batched.server, "repeat_batched", "fail", failed_before + 1)
    assert doc["inference_stats"]["fail"]["count"] == failed_before + 1
    assert blocker.is_alive()
    batched.gate.unlink()
    blocker.join(STATE_DEADLINE_S)
    # ...and it never reaches the model: the next request runs alone, right after the blocker.
    later: dict[int, list[dict[str, Any]]] = {}
    batched.stream(6, 1, later)
    assert [e["OUT"] for e in later[6]] == [6000]
    assert batched.executions() == [[1], [6]]


def test_a_failing_decoupled_model_opens_its_circuit_and_a_good_probe_closes_it(
    tmp_path: Path,
) -> None:
    config = REPEAT_CONFIG.format(name="fragile", marker_dir=tmp_path) + (
        'parameters { key: "circuit_breaker_failures" value: { string_value: "2" } }\n'
        'parameters { key: "circuit_breaker_open_s" value: { string_value: "0.2" } }\n'
    )
    write_model(tmp_path, "fragile", REPEAT_INFERD_PY, config)
    with run_server(tmp_path) as running, running.client() as client:
        circuit = running.server.registry.models["fragile"].circuit
        url = "/v2/models/fragile/generate_stream"
        for failures in (1, 2):
            r = client.post(url, json={"N": 2, "TAG": 1, "RAISE_AT": 0})
            assert r.status_code == 500
            wait_for_count(running, "fragile", "fail", failures)  # the outcome is counted
        assert circuit.is_open
        refused = client.post(url, json={"N": 1, "TAG": 1})
        assert refused.status_code == 503 and "circuit is open" in refused.json()["error"]
        deadline = time.monotonic() + STATE_DEADLINE_S
        while circuit.retry_in_s() > 0:  # the breaker's own clock: a probe is due
            assert time.monotonic() < deadline
            time.sleep(0.005)
        probe = client.post(url, json={"N": 2, "TAG": 1})
        assert probe.status_code == 200
        assert [e["OUT"] for e in sse_events(iter(probe.text.splitlines()))] == [1000, 1001]
        wait_for_count(running, "fragile", "success", 1)
        assert not circuit.is_open  # a successful stream closed it
