"""The fuzz target: hypothesis against one `inferd serve` process, over raw HTTP sockets,
HTTP requests with fuzzed bodies and headers, raw gRPC bytes to every method, and structured
ModelInferRequest / ModelStreamInfer variants.

Properties, case by case and at the end:
- no 5xx / INTERNAL / UNKNOWN, except the 500 / INTERNAL of `faulty`, a model that raises on
  purpose (negative input), whose message must then be the model's;
- every answer comes within the server's own timeouts (a stalled server fails the case);
- the server is live after every case, and live and ready (HTTP and gRPC) afterwards;
- its RSS (read from /proc/<pid>/status) grows by less than 200 MiB, and its log by less
  than 4 KiB a case.

CI runs FUZZ_EXAMPLES cases per test (a few thousand in all); by hand, more:

    INFERD_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q -s -p no:cacheprovider \\
        tests/integration/protocol/test_fuzz.py

(`-s` shows the summary line: cases, 5xx, duration, RSS before and after; docs/reliability.md
has the figures of such a run.)
"""

from __future__ import annotations

import gzip
import os
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.support.hostile_requests import DATATYPES, GRPC_DIMS, JSON, REQUESTISH
from tests.support.servers import CliServer, free_port, run_cli_server

FUZZ_EXAMPLES = int(os.environ.get("INFERD_FUZZ_EXAMPLES", "500"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,  # nothing written into the checkout; a failure prints its example
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ANSWER_TIMEOUT_S = 30.0  # well past the server's header and body timeouts (2 s here)
RSS_GROWTH_BYTES = 200 << 20
LOG_BYTES_PER_CASE = 4096
RAISER = "faulty"  # tests/support/models.py: raises on negative input, on purpose
RAISED = "negative input is not allowed"
MODELS = [
    "identity_fp32",
    "identity_bytes",
    "identity_int8",
    "identity_fp16",
    "identity_bool",
    "mlp",
    "fixed",
    "counter",
    RAISER,
]
SERVICE = "inference.GRPCInferenceService"
GRPC_METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
UNARY_METHODS = [m for m in GRPC_METHODS if m != "ModelStreamInfer"]
# Answers that are a refusal of the request, never the server failing.
CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


def server_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


@dataclass
class Target:
    cli: CliServer
    grpc_address: str
    http: httpx.Client
    channel: grpc.Channel
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    rss_before: int = 0
    log_before: int = 0
    started: float = field(default_factory=time.monotonic)
    cases: int = 0
    answers: Counter[str] = field(default_factory=Counter)

    @property
    def pid(self) -> int:
        return self.cli.proc.pid

    @property
    def port(self) -> int:
        return int(self.cli.url.rsplit(":", 1)[1])

    def check_status(self, status: int, model: str, error: str) -> None:
        self.cases += 1
        self.answers[f"http {status // 100}xx"] += 1
        if status >= 500:
            assert status == 500 and model == RAISER and RAISED in error, (status, model, error)
            self.answers["5xx from the raising model"] += 1
        assert self.http.get("/v2/health/live").status_code == 200

    def check_code(self, code: grpc.StatusCode, model: str, details: str) -> None:
        self.cases += 1
        self.answers[f"grpc {code.name}"] += 1
        if code not in CLIENT_CODES:
            assert code is grpc.StatusCode.INTERNAL, (code, model, details)
            assert model == RAISER and RAISED in details, (code, model, details)
            self.answers["5xx from the raising model"] += 1
        assert self.stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


@pytest.fixture(scope="module")
def target(good_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    log = tmp_path_factory.mktemp("fuzz") / "server.log"
    grpc_port = free_port()
    args = (
        "--grpc-port", str(grpc_port), "--max-request-mib", "4", "--log-sample-rate", "0",
        "--header-timeout-secs", "2", "--body-timeout-secs", "2",
    )  # fmt: skip
    with (
        run_cli_server(good_repository, log, *args) as cli,
        httpx.Client(base_url=cli.url, timeout=ANSWER_TIMEOUT_S) as http,
        grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        t = Target(cli, f"127.0.0.1:{grpc_port}", http, channel, stub)
        # Warm up: first inferences allocate session buffers that are not a leak.
        for model in MODELS:
            http.post(f"/v2/models/{model}/infer", content=orjson.dumps(_good(model)))
        t.rss_before, t.log_before = server_rss(t.pid), log.stat().st_size
        t.started = time.monotonic()
        yield t


# -- what a well-formed request to each model looks like; mutations start from it ------------

_SHAPES = {"mlp": ("input", "FP32", [1, 8]), "fixed": ("IN", "FP32", [2, 3])}
_SHAPES |= {"counter": ("IN", "FP32", [1, 3]), RAISER: ("IN", "FP32", [1, 4])}


def _good(model: str, value: float = 1.0) -> dict[str, Any]:
    name, datatype, shape = _SHAPES.get(model, ("INPUT0", "", [1, 2]))
    if not datatype:
        datatype = model.removeprefix("identity_").upper()
    count = shape[0] * shape[1]
    by_type: dict[str, list[Any]] = {
        "BYTES": ["ab"] * count,
        "BOOL": [True] * count,
        "INT8": [int(value) if abs(value) < 100 else 100] * count,
    }
    data = by_type.get(datatype, [value] * count)
    return {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}


# -- (a) raw HTTP/1.1 over a socket: request lines, headers and bodies as bytes --------------

TEXTS = st.text(max_size=24)  # any code point, controls included
MODEL_NAMES = (
    st.sampled_from(MODELS)
    | st.sampled_from(
        ["%0a", "a%2fb", "..%2f..", "%00", "x" * 300, "%ff%fe", "mlp%0d%0aX-Forged:%201", "%"]
    )
    | TEXTS.map(lambda s: quote(s, safe=""))
)
TAILS = st.sampled_from(
    [
        "/infer",
        "/infer",
        "",
        "/ready",
        "/config",
        "/stats",
        "/versions/1/infer",
        "/versions/x/infer",
        "/versions/99999999999999999999/infer",
        "/infer?x=1",
        "/infer/",
    ]
)
PATHS = st.builds(lambda m, t: f"/v2/models/{m}{t}", MODEL_NAMES, TAILS) | st.sampled_from(
    [
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/repository/index",
        "/v2/repository/models/mlp/load",
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/systemsharedmemory/status",
        "/metrics",
        "*",
        "http://x/v2/health/ready",
        "/" + "a" * 9000,
        "",
    ]
)
METHODS = st.sampled_from(["POST", "POST", "GET", "PUT", "HEAD", "OPTIONS", "DELETE", "G ET", ""])
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", "http/1.1"])
HEADER_NAMES = st.sampled_from(
    [
        "Content-Type",
        "Content-Encoding",
        "Inference-Header-Content-Length",
        "inferd-timeout-ms",
        "inferd-routing-key",
        "traceparent",
        "Expect",
        "Upgrade",
        "Connection",
        "Host",
        "Authorization",
        "Transfer-Encoding",
    ]
) | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"),
    min_size=1,
    max_size=12,
)
HEADER_VALUES = (
    st.sampled_from(
        ["application/json", "gzip", "deflate", "inf", "-1", "nan", "1e309", "h2c", "100-continue"]
    )
    | st.integers(min_value=-(2**70), max_value=2**70).map(str)
    | TEXTS
    | st.just("v" * 40_000)
)
BODIES = JSON.map(orjson.dumps) | REQUESTISH.map(orjson.dumps) | st.binary(max_size=256)


def _read_status(sock: socket.socket, head_only: bool) -> tuple[int | None, bytes]:
    """The first final response's status code (None: closed without one) and its body."""
    data = b""
    while b"\r\n\r\n" not in data or data.startswith(b"HTTP/1.1 100 "):
        if data.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in data:
            data = data.partition(b"\r\n\r\n")[2]  # 100 Continue: the answer follows
            continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    if not data:
        return None, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    parts = status_line.split(b" ")
    assert parts[0] == b"HTTP/1.1" and parts[1].isdigit(), status_line
    length = 0
    for line in head.split(b"\r\n")[1:] if not head_only else ():
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(parts[1]), rest[:length]


@FUZZ
@given(
    method=METHODS,
    path=PATHS,
    version=VERSIONS,
    headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6),
    body=BODIES,
    length=st.sampled_from(["exact", "exact", "exact", "short", "none", "chunked", "gzip"]),
)
def test_raw_http_requests(
    target: Target,
    method: str,
    path: str,
    version: str,
    headers: list[tuple[str, str]],
    body: bytes,
    length: str,
) -> None:
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers]
    if length == "gzip":
        body = gzip.compress(body)
        lines.append("Content-Encoding: gzip")
    if length == "chunked":
        lines.append("Transfer-Encoding: chunked")
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    elif length != "none":  # never more than is sent: the server would wait for the rest
        declared = len(body) if length != "short" else len(body) // 2
        lines.append(f"Content-Length: {declared}")
    raw = "\r\n".join(lines).encode("utf-8", "surrogatepass") + b"\r\n\r\n" + body
    model = path.removeprefix("/v2/models/").split("/", 1)[0]
    with socket.create_connection(("127.0.0.1", target.port), timeout=ANSWER_TIMEOUT_S) as sock:
        sock.sendall(raw)
        status, answer = _read_status(sock, method == "HEAD")
    target.check_status(status or 0, model, answer.decode("utf-8", "replace"))


# -- (b) inference requests with fuzzed JSON bodies and headers (httpx) ----------------------

# What httpx sends: header names are tokens, values printable (raw sockets send the rest).
TOKEN_NAMES = HEADER_NAMES.filter(
    lambda n: (
        n.lower() not in {"content-length", "host", "transfer-encoding"}
        and n.replace("-", "").replace("_", "").isalnum()
        and n.isascii()
    )
)
MUTATED = st.sampled_from(["name", "datatype", "shape", "data", "parameters", "outputs", "none"])


@FUZZ
@given(
    model=st.sampled_from(MODELS),
    value=st.sampled_from([1.0, -1.0, 0.0, 1e39, 5000.0]),
    mutation=MUTATED,
    replacement=JSON,
    headers=st.dictionaries(
        TOKEN_NAMES,
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip),
        max_size=3,
    ),
)
def test_fuzzed_infer_requests(
    target: Target,
    model: str,
    value: float,
    mutation: str,
    replacement: Any,
    headers: dict[str, str],
) -> None:
    doc = _good(model, value)
    if mutation in ("parameters", "outputs"):
        doc[mutation] = replacement
    elif mutation != "none":
        doc["inputs"][0][mutation] = replacement
    r = target.http.post(f"/v2/models/{model}/infer", content=orjson.dumps(doc), headers=headers)
    error = r.json().get("error", "") if r.headers.get("content-type") == "application/json" else ""
    target.check_status(r.status_code, model, str(error))


# -- (c) raw bytes to every gRPC method -------------------------------------------------------


@FUZZ
@given(method=st.sampled_from(UNARY_METHODS), raw=st.binary(max_size=128))
def test_raw_grpc_messages(target: Target, method: str, raw: bytes) -> None:
    call = target.channel.unary_unary(f"/{SERVICE}/{method}")
    model = ""
    if method == "ModelInfer":
        try:
            model = pb.ModelInferRequest.FromString(raw).model_name
        except Exception:  # noqa: BLE001 (not a message: the server must say so)
            model = ""
    try:
        call(raw, timeout=ANSWER_TIMEOUT_S)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    target.check_code(code, model, details)


@pytest.mark.parametrize("method", UNARY_METHODS)
def test_unparseable_grpc_messages_are_invalid_argument(target: Target, method: str) -> None:
    call = target.channel.unary_unary(f"/{SERVICE}/{method}")
    with pytest.raises(grpc.RpcError) as info:
        call(b"\xff\xff\xff\xff\x0f", timeout=ANSWER_TIMEOUT_S)  # a varint past 64 bits
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert (info.value.details() or "").startswith("malformed "), info.value.details()
    assert "DecodeError" not in (info.value.details() or "")


# -- (d) structured ModelInferRequest variants, unary and streamed ----------------------------

PARAMETER_KEYS = st.sampled_from(
    ["sequence_id", "sequence_start", "priority", "timeout", "binary_data_output", "x", ""]
)


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    model = draw(st.sampled_from([*MODELS, "nope", ""]))
    msg = pb.ModelInferRequest(
        model_name=model, model_version=draw(st.sampled_from(["", "1", "x"]))
    )
    good = _good(model, draw(st.sampled_from([1.0, -1.0]))) if model in MODELS else _good("mlp")
    for inp in good["inputs"]:
        t = msg.inputs.add(
            name=draw(st.sampled_from([inp["name"], inp["name"], "X", ""])),
            datatype=draw(st.sampled_from([inp["datatype"]] * 3 + DATATYPES)),
            shape=draw(st.sampled_from([inp["shape"]] * 3) | st.lists(GRPC_DIMS, max_size=3)),
        )
        where = draw(st.sampled_from(["contents", "raw", "both", "none"]))
        if where in ("contents", "both"):
            data = inp["data"]
            if inp["datatype"] == "BYTES":
                t.contents.bytes_contents.extend(x.encode() for x in data)
            elif inp["datatype"] == "BOOL":
                t.contents.bool_contents.extend(data)
            elif inp["datatype"] == "INT8":
                t.contents.int_contents.extend(data)
            else:
                t.contents.fp32_contents.extend(data)
        if where in ("raw", "both"):
            msg.raw_input_contents.append(draw(st.binary(max_size=64)))
    for key in draw(st.lists(PARAMETER_KEYS, max_size=3)):
        kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param"]))
        value: Any = {
            "bool_param": draw(st.booleans()),
            "int64_param": draw(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
            "string_param": draw(st.text(max_size=8)),
        }[kind]
        setattr(msg.parameters[key], kind, value)
    if draw(st.booleans()):
        msg.outputs.add(name=draw(st.sampled_from(["OUT", "OUTPUT0", "label", "nope", ""])))
    return msg


@FUZZ
@given(msg=infer_requests())
def test_structured_grpc_infer_requests(target: Target, msg: pb.ModelInferRequest) -> None:
    try:
        target.stub.ModelInfer(msg, timeout=ANSWER_TIMEOUT_S)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    target.check_code(code, msg.model_name, details)


@settings(FUZZ, max_examples=max(FUZZ_EXAMPLES // 5, 10))
@given(msgs=st.lists(infer_requests(), min_size=1, max_size=4))
def test_structured_grpc_streams(target: Target, msgs: list[pb.ModelInferRequest]) -> None:
    """Errors in a stream come as messages (error_message), the stream itself ending OK."""
    answers = target.stub.ModelStreamInfer(iter(msgs), timeout=ANSWER_TIMEOUT_S)
    try:
        for answer in answers:
            # A failure of inferd's own reads "internal error; see the server log".
            assert "internal error" not in answer.error_message, answer.error_message
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    target.check_code(code, "", details)


# -- afterwards: live, ready, memory and log bounded (runs last in this module) -------------


def test_server_is_live_ready_and_bounded_after_fuzzing(target: Target) -> None:
    assert target.http.get("/v2/health/live").status_code == 200
    assert target.http.get("/v2/health/ready").status_code == 200
    assert target.stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
    for model in MODELS:
        assert target.http.get(f"/v2/models/{model}/ready").status_code == 200, model
    rss_after = server_rss(target.pid)
    log_growth = target.cli.log_path.stat().st_size - target.log_before
    duration = time.monotonic() - target.started
    print(
        f"\nfuzz: {target.cases} cases in {duration:.0f} s; "
        f"5xx: {target.answers['5xx from the raising model']} (all from '{RAISER}', raising "
        f"on purpose); RSS {target.rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB; "
        f"log +{log_growth / 1024:.0f} KiB; answers: {dict(sorted(target.answers.items()))}"
    )
    assert rss_after < target.rss_before + RSS_GROWTH_BYTES
    assert log_growth < LOG_BYTES_PER_CASE * max(target.cases, 1)
