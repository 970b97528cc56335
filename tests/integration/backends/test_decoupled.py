"""Decoupled models: zero or more responses per request, then the final flag.

One case table, run over gRPC ModelStreamInfer (Triton's own client: `start_stream`,
`async_stream_infer`) and HTTP generate_stream (server-sent events, parsed here), against the
same model written twice: in Triton's style (`request.get_response_sender()`) and with
inferd's `predict_stream(inputs, responses)` (tests/support/stream_models.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.servers import STATE_DEADLINE_S, RunningServer, run_server
from tests.support.stream_clients import (
    GrpcStream,
    Stream,
    grpc_collect,
    grpc_inputs,
    http_stream,
    metric,
    one_stream,
    sse_events,
    stats,
    wait_for_count,
    wait_for_file,
)
from tests.support.stream_models import DROPPED_AFTER_CANCEL, REPEAT_MODELS, write_stream_models

MODELS = list(REPEAT_MODELS)
PROTOCOLS = ["grpc", "http"]


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("stream_repo")
    write_stream_models(repo, markers)
    with run_server(repo) as running:
        yield running


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


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_worker_process_dying_mid_stream_ends_it_and_is_restarted(
    server: RunningServer, protocol: str
) -> None:
    s = one_stream(protocol, server, "repeat_isolated", True, N=5, TAG=8, CRASH_AT=2)
    assert [out for out, _ in s.items] == [8000, 8001, "error"]
    assert "worker process died (exit code 1) while streaming this request" in s.items[2][1]
    # The next request waits for the restarted worker, and is served.
    assert one_stream(protocol, server, "repeat_isolated", N=2, TAG=8).outs == [8000, 8001]


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
