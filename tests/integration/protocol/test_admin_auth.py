"""The admin gate (issue #14, item 1): a restricted API answers only a call that presents its
credential, over HTTP and gRPC alike, from one case table, with Triton's own clients.

The server restricts `model-repository` and `statistics` Triton's way (a header and value,
`--http-restricted-api` / `--grpc-restricted-protocol`) and also has an admin token, which
guards the admin groups (model-repository, shared-memory, trace, logging) but not statistics.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import write_plus_model
from tests.support.security import ADMIN_TOKEN, AUTH
from tests.support.servers import RunningServer, run_server

PROTOCOLS = ["http", "grpc"]
HTTP_VALUE = "http-restricted-value-1"
GRPC_VALUE = "grpc-restricted-value-2"
GRPC_KEY = "triton-grpc-protocol-admin-key"  # Triton's name for key 'admin-key' over gRPC
DENIED = {"http": "401", "grpc": "StatusCode.UNAUTHENTICATED"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("secured_repo")
    write_plus_model(repo, "first", [1])
    with run_server(
        repo,
        model_control_mode="explicit",
        load_models=("first",),
        admin_token=ADMIN_TOKEN,
        http_restricted_api=(f"model-repository,statistics:admin-key={HTTP_VALUE}",),
        grpc_restricted_protocol=(f"model-repository,statistics:admin-key={GRPC_VALUE}",),
    ) as running:
        yield running


def triton_client(protocol: str, server: RunningServer) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    return grpcclient.InferenceServerClient(server.grpc_address)


def infer_plus(client: Any, protocol: str, headers: dict[str, str] | None = None) -> Any:
    mod: Any = httpclient if protocol == "http" else grpcclient
    inp = mod.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    # A copy: tritonclient.http adds its own headers to the dict it is given.
    return client.infer("first", [inp], headers=None if headers is None else dict(headers))


@dataclass(frozen=True)
class Case:
    id: str
    http: dict[str, str]  # headers sent over HTTP
    grpc: dict[str, str]  # metadata sent over gRPC
    repository: bool  # the model-repository API answers
    statistics: bool  # the statistics API answers


def both(id: str, headers: dict[str, str], repository: bool) -> Case:
    """The same headers over both protocols; statistics stay closed to the admin token."""
    return Case(id, headers, headers, repository, False)


CASES = [
    Case("no credential", {}, {}, False, False),
    Case("admin token", AUTH, AUTH, True, False),
    both("token, lower-case scheme", {"authorization": f"bearer {ADMIN_TOKEN}"}, True),
    both("token in another scheme", {"authorization": f"Basic {ADMIN_TOKEN}"}, False),
    both("token without a scheme", {"authorization": ADMIN_TOKEN}, False),
    both("wrong token", {"authorization": "Bearer " + "x" * len(ADMIN_TOKEN)}, False),
    both("token's prefix", {"authorization": f"Bearer {ADMIN_TOKEN[:-1]}"}, False),
    Case("restricted key", {"admin-key": HTTP_VALUE}, {GRPC_KEY: GRPC_VALUE}, True, True),
    Case("restricted key, wrong value", {"admin-key": "nope"}, {GRPC_KEY: "nope"}, False, False),
    Case(
        "the other protocol's value",
        {"admin-key": GRPC_VALUE},
        {GRPC_KEY: HTTP_VALUE},
        False,
        False,
    ),
    Case("gRPC key without Triton's prefix", {}, {"admin-key": GRPC_VALUE}, False, False),
]


def expect(call: Callable[[], Any], allowed: bool, protocol: str, group: str) -> None:
    if allowed:
        call()
        return
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == DENIED[protocol], info.value
    message = info.value.message()
    assert f"the {group} API is restricted" in message
    for secret in (ADMIN_TOKEN, HTTP_VALUE, GRPC_VALUE):
        assert secret not in message  # the 401 says how to send a credential, never its value


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_restricted_apis_answer_only_their_credential(
    secured: RunningServer, protocol: str, case: Case
) -> None:
    client = triton_client(protocol, secured)
    headers = case.http if protocol == "http" else case.grpc
    try:
        repository = [
            lambda: client.load_model("first", headers=headers),
            lambda: client.get_model_repository_index(headers=headers),
            lambda: client.unload_model("nope", headers=headers),  # refused before "unknown"
        ]
        if case.repository:
            with pytest.raises(InferenceServerException) as info:
                repository.pop()()
            assert "unknown model 'nope'" in info.value.message()
        for call in repository:
            expect(call, case.repository, protocol, "model-repository")
        expect(
            lambda: client.get_inference_statistics("first", headers=headers),
            case.statistics,
            protocol,
            "statistics",
        )
        # Unrestricted groups answer anyone, with or without a credential.
        assert client.is_server_ready(headers=headers)
        assert client.is_model_ready("first", headers=headers)
        assert client.get_model_metadata("first", headers=headers)
        result = infer_plus(client, protocol, headers)
        np.testing.assert_array_equal(result.as_numpy("y"), np.ones((1, 4), np.float32))
    finally:
        client.close()


def test_http_401_names_the_bearer_scheme(secured: RunningServer) -> None:
    with secured.client() as c:
        r = c.post("/v2/repository/models/first/load")
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "'authorization: Bearer <admin token>'" in r.json()["error"]
        assert "header 'admin-key' (--http-restricted-api)" in r.json()["error"]
        # Routing is part of the model-repository API.
        assert c.get("/v2/models/first/routing").status_code == 401
        assert c.get("/v2/models/first/routing", headers=AUTH).status_code == 200


def test_grpc_routing_service_is_behind_the_gate(secured: RunningServer) -> None:
    channel = grpc.insecure_channel(secured.grpc_address)
    get_routing = channel.unary_unary("/inferd.admin.v1.Admin/GetRouting")
    body = json.dumps({"model": "first"}).encode()
    try:
        with pytest.raises(grpc.RpcError) as info:
            get_routing(body)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert json.loads(get_routing(body, metadata=tuple(AUTH.items())))["model"] == "first"
    finally:
        channel.close()


@pytest.mark.parametrize(
    "method",
    ["TraceSetting", "LogSettings", "SystemSharedMemoryRegister", "CudaSharedMemoryStatus"],
)
def test_the_gate_covers_every_admin_method(secured: RunningServer, method: str) -> None:
    """The gate sits below every method, by API group: an admin method, implemented or not,
    answers UNAUTHENTICATED without the credential and goes on to its own answer with it."""
    channel = grpc.insecure_channel(secured.grpc_address)
    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
    try:
        with pytest.raises(grpc.RpcError) as info:
            call(b"")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        try:
            call(b"", metadata=tuple(AUTH.items()))
        except grpc.RpcError as exc:
            assert exc.code() != grpc.StatusCode.UNAUTHENTICATED, exc.details()
    finally:
        channel.close()


INFER_VALUE = "infer-restricted-value-3"
INFER_HEADERS = {
    "http": {"infer-key": INFER_VALUE},
    "grpc": {"triton-grpc-protocol-infer-key": INFER_VALUE},
}


@pytest.fixture(scope="module")
def infer_restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Inference restricted too (Triton allows any group): the infer fast path checks it."""
    repo = tmp_path_factory.mktemp("infer_restricted_repo")
    write_plus_model(repo, "first", [1])
    with run_server(
        repo,
        http_restricted_api=(f"inference:infer-key={INFER_VALUE}",),
        grpc_restricted_protocol=(f"inference:infer-key={INFER_VALUE}",),
    ) as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restricted_inference_needs_its_header(
    infer_restricted: RunningServer, protocol: str
) -> None:
    client = triton_client(protocol, infer_restricted)
    try:
        expect(lambda: infer_plus(client, protocol), False, protocol, "inference")
        wrong = dict.fromkeys(INFER_HEADERS[protocol], "nope")
        expect(lambda: infer_plus(client, protocol, wrong), False, protocol, "inference")
        result = infer_plus(client, protocol, INFER_HEADERS[protocol])
        np.testing.assert_array_equal(result.as_numpy("y"), np.ones((1, 4), np.float32))
        assert client.is_server_ready()  # health is not restricted here
    finally:
        client.close()


@pytest.mark.parametrize("credential", [False, True])
def test_restricted_inference_over_a_grpc_stream(
    infer_restricted: RunningServer, credential: bool
) -> None:
    client = grpcclient.InferenceServerClient(infer_restricted.grpc_address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)),
        headers=INFER_HEADERS["grpc"] if credential else None,
    )
    inp = grpcclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    try:
        client.async_stream_infer("first", [inp], request_id="s1")
    except InferenceServerException:
        # The server may refuse the stream before this request is queued on it; then
        # the refusal is what the callback received (checked below).
        if credential:
            raise
    result, error = answers.get(timeout=30)
    client.stop_stream()
    client.close()
    if credential:
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("y"), np.ones((1, 4), np.float32))
    else:
        assert result is None
        assert "the inference API is restricted" in str(error)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trace_and_log_settings_are_behind_the_admin_token(
    secured: RunningServer, protocol: str
) -> None:
    client = triton_client(protocol, secured)
    try:
        for call in (
            lambda h: client.get_log_settings(headers=h),
            lambda h: client.get_trace_settings(headers=h),
            lambda h: client.update_trace_settings(settings={"trace_rate": "2"}, headers=h),
        ):
            with pytest.raises(InferenceServerException) as info:
                call(None)
            assert info.value.status() == DENIED[protocol]
        assert client.get_log_settings(headers=dict(AUTH)) is not None
        # Past the gate, the change itself is refused: this server exports no spans.
        with pytest.raises(InferenceServerException) as info:
            client.update_trace_settings(settings={"trace_rate": "2"}, headers=dict(AUTH))
        assert "tracing is off" in info.value.message()
    finally:
        client.close()
