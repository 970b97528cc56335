"""Limits a client meets in its requests, over HTTP and gRPC alike: the response size
(--max-response-mib), backpressure on a ModelStreamInfer stream that is not read
(--max-stream-pending), and large requests decoded off the event loop, so that they delay
only themselves (--offload-threshold-kib)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.limits import Limits
from tests.support.servers import STATE_DEADLINE_S, RunningServer, run_server

RESPONSE_LIMIT = 16 * 1024


@pytest.fixture(scope="module")
def small_responses(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, max_response_bytes=RESPONSE_LIMIT) as running:
        yield running


def _client(protocol: str, server: RunningServer) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    return grpcclient.InferenceServerClient(server.grpc_address)


def _failures(server: RunningServer, model: str) -> int:
    with server.client() as c:
        stats = c.get(f"/v2/models/{model}/stats").json()["model_stats"]
    return int(sum(s["inference_stats"]["fail"]["count"] for s in stats))


# (id, protocol, elements, JSON output) -> refused?  FP32: 4 bytes an element in binary, about
# 11 as JSON text; the limit is 16 KiB.
RESPONSES = [
    ("binary over the limit", "http", 8192, False, True),
    ("binary over the limit", "grpc", 8192, False, True),
    ("JSON text over the limit", "http", 3000, True, True),  # 12 KB binary, ~33 KB JSON
    ("within the limit", "http", 1000, True, False),
    ("within the limit", "grpc", 3000, False, False),
]


@pytest.mark.parametrize(
    ("protocol", "elements", "as_json", "refused"),
    [c[1:] for c in RESPONSES],
    ids=[f"{c[1]}: {c[0]}" for c in RESPONSES],
)
def test_a_response_over_the_limit_fails_naming_it_and_counts_as_a_failure(
    small_responses: RunningServer, protocol: str, elements: int, as_json: bool, refused: bool
) -> None:
    mod: Any = httpclient if protocol == "http" else grpcclient
    client = _client(protocol, small_responses)
    data = np.random.default_rng(1).random((1, elements), dtype=np.float32)
    inp = mod.InferInput("INPUT0", [1, elements], "FP32")
    inp.set_data_from_numpy(data)
    out = (
        mod.InferRequestedOutput("OUTPUT0", binary_data=not as_json)
        if protocol == "http"
        else mod.InferRequestedOutput("OUTPUT0")
    )
    before = _failures(small_responses, "identity_fp32")
    if refused:
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity_fp32", [inp], outputs=[out])
        expected = "413" if protocol == "http" else "StatusCode.RESOURCE_EXHAUSTED"
        assert info.value.status() == expected, info.value.message()
        assert f"more than the limit of {RESPONSE_LIMIT} bytes" in info.value.message()
        assert "--max-response-mib" in info.value.message()
        assert _failures(small_responses, "identity_fp32") == before + 1
    else:
        result = client.infer("identity_fp32", [inp], outputs=[out])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        assert _failures(small_responses, "identity_fp32") == before
    client.close()


# -- gRPC stream backpressure ----------------------------------------------------------------

PENDING = 4
STREAMED = 300
ELEMENTS = 64 * 1024  # 256 KiB a message: the HTTP/2 windows fill after a few


@pytest.fixture(scope="module")
def stream_server(good_repository: Path) -> Iterator[RunningServer]:
    with run_server(good_repository, limits=Limits(max_stream_pending=PENDING)) as running:
        yield running


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not reached within {STATE_DEADLINE_S:.0f} s: {what}"
        time.sleep(0.005)


def test_a_stream_that_is_not_read_stops_being_read_and_loses_nothing(
    stream_server: RunningServer,
) -> None:
    servicer = stream_server.server.grpc_servicer
    assert servicer is not None
    payload = np.arange(ELEMENTS, dtype=np.float32).tobytes()
    sent: list[int] = []

    def requests() -> Iterator[pb.ModelInferRequest]:
        for i in range(STREAMED):
            msg = pb.ModelInferRequest(model_name="identity_fp32", id=str(i))
            msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, ELEMENTS])
            msg.raw_input_contents.append(payload)
            sent.append(i)
            yield msg

    channel = grpc.insecure_channel(stream_server.grpc_address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    responses = stub.ModelStreamInfer(requests())  # not read yet
    _wait(lambda: servicer.streaming.streams_held == 1, "the server stops reading the stream")
    # Held: only a handful of the 300 requests left the client (flow control), and the
    # server holds no more than PENDING answers it could not send.
    assert len(sent) < STREAMED / 2
    # Everyone else is served meanwhile.
    other = grpcclient.InferenceServerClient(stream_server.grpc_address)
    assert other.is_server_ready()
    inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    assert other.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").tolist() == [[1.0, 2.0]]
    other.close()
    with stream_server.client() as c:
        assert c.get("/v2/health/ready").status_code == 200
    # Reading resumes the stream: every request is answered, in full, exactly once.
    ids = []
    for response in responses:
        assert response.error_message == ""
        assert response.infer_response.raw_output_contents[0] == payload
        ids.append(int(response.infer_response.id))
        if len(ids) == STREAMED:
            break
    assert sorted(ids) == list(range(STREAMED))
    responses.cancel()
    channel.close()
    _wait(lambda: servicer.streaming.streams_held == 0, "the stream's reader ends")


# -- large requests are decoded off the event loop --------------------------------------------

BIG_BYTES = 2 * 1024 * 1024  # empty BYTES elements: 8 MiB, a second of pure-Python decoding
BIG_JSON = 2 * 1024 * 1024  # zeros: 4 MiB of JSON, one long orjson call


@pytest.fixture(scope="module")
def big_server(good_repository: Path) -> Iterator[RunningServer]:
    limits = Limits(max_bytes_elements=BIG_BYTES)
    with run_server(good_repository, limits=limits) as running:
        yield running


def _send_http_bytes(server: RunningServer) -> httpx.Response:
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, BIG_BYTES],
                    "parameters": {"binary_data_size": 4 * BIG_BYTES},
                }
            ]
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(head))}
    with httpx.Client(base_url=server.url, timeout=120) as c:
        # To an FP32 model: decoded in full, then refused (datatype), so the answer is quick
        # once the decoding is done.
        body = head + b"\0\0\0\0" * BIG_BYTES
        return c.post("/v2/models/identity_fp32/infer", content=body, headers=headers)


def _send_http_json(server: RunningServer) -> httpx.Response:
    zeros = b"0," * (BIG_JSON - 1) + b"0"
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,%d],"data":[' % BIG_JSON
        + zeros
        + b"]}]}"
    )
    with httpx.Client(base_url=server.url, timeout=120) as c:
        return c.post("/v2/models/identity_int8/infer", content=body)


def _send_grpc_bytes(server: RunningServer) -> str:
    msg = pb.ModelInferRequest(model_name="identity_fp32")
    msg.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, BIG_BYTES])
    msg.raw_input_contents.append(b"\0\0\0\0" * BIG_BYTES)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(msg, timeout=120)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return str(info.value.details())


SENDERS = {"http binary": _send_http_bytes, "http json": _send_http_json, "grpc": _send_grpc_bytes}


@pytest.mark.parametrize("kind", list(SENDERS))
def test_health_probes_are_answered_while_a_large_request_is_decoded(
    big_server: RunningServer, kind: str
) -> None:
    offload = big_server.server.offload
    grpc_probe = grpcclient.InferenceServerClient(big_server.grpc_address)
    with ThreadPoolExecutor(1) as pool, big_server.client() as http_probe:
        big: Future[Any] = pool.submit(SENDERS[kind], big_server)
        _wait(lambda: offload.running > 0 or big.done(), "the large request is being decoded")
        during = 0  # probes answered while the large request was still being decoded
        while offload.running > 0 and during < 3:
            assert http_probe.get("/v2/health/ready").status_code == 200
            assert grpc_probe.is_server_live()
            if offload.running > 0:  # still decoding after the answers: they did not wait
                assert not big.done()
                during += 1
        assert during > 0, "the probes waited for the large request's decoding"
        result = big.result(timeout=120)
    grpc_probe.close()
    message = result.json()["error"] if isinstance(result, httpx.Response) else result
    assert "datatype" in message  # decoded in full, then refused for the model's datatype


def test_offloaded_decoding_gives_the_same_errors_as_inline(big_server: RunningServer) -> None:
    # A malformed JSON body past the threshold is parsed in the helper process: its error
    # must come back as the same 400, not as a crash of the helper.
    body = b'{"inputs": [' + b" " * (2 * 1024 * 1024) + b"oops"
    with big_server.client() as c:
        r = c.post("/v2/models/identity_fp32/infer", content=body)
    assert r.status_code == 400
    assert "malformed JSON request" in r.json()["error"]
