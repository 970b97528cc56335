"""The soak's invalid and hostile clients: requests no server should accept, each with the
answers it may get, and slow clients that hold connections open.

Each `Hostile` kind is sent as a client would send it (raw bytes on a socket for HTTP, so
that anything can be sent; gRPC through a channel that passes bytes through, or
tritonclient for well-formed messages with wrong contents) and answered with its status:
an HTTP status, a gRPC code name, `closed` (the server closed the connection without an
answer) or `no_answer` (nothing within `ANSWER_TIMEOUT_S`). `expected` is what the answer
may be; anything else is a finding. A model that raises on bytes that are not UTF-8 (the
soak's `text_stats_raw`) may answer 500 / INTERNAL: the model's error, not the server's.

`SlowClient`s hold connections the way slowloris does: a head sent one byte a second, a
body that stops half way, a connection that never sends a byte. The server must close
each within its own limit (docs/limits.md: head 10 s, body pause 30 s, idle 5 s) plus
`SLOW_MARGIN_S`; `kept` is the finding that it did not.
"""

from __future__ import annotations

import json
import random
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.support.soak_requests import grpc_status

ANSWER_TIMEOUT_S = 15.0
SLOW_MARGIN_S = 10.0
MAX_REQUEST_MIB = 8  # the soak's --max-request-mib: oversized requests need not be 64 MiB
INVALID_UTF8 = b"caf\xc3(\xff\xfe"
IN_A_ROW = 6  # one more than a model's default unready_after_failures
SERVICE = "/inference.GRPCInferenceService/"


@dataclass(frozen=True)
class Hostile:
    name: str
    protocol: str
    expected: frozenset[str]
    send: Callable[[Target], str]
    heavy: bool = False  # megabytes on the wire: sent less often


@dataclass(frozen=True)
class Target:
    http_port: int
    grpc_port: int


# -- raw HTTP --------------------------------------------------------------------------------


def _read_status(sock: socket.socket) -> str:
    """The status of the first response on `sock`, `closed` or `no_answer`."""
    sock.settimeout(ANSWER_TIMEOUT_S)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return "closed"
            data += chunk
    except TimeoutError:
        return "no_answer"
    except ConnectionError:
        return "closed"
    parts = data.split(b"\r\n", 1)[0].split()
    return parts[1].decode() if len(parts) > 1 else "closed"


def raw_http(port: int, data: bytes, then: bytes = b"") -> str:
    """Send `data` (and `then`, ignoring a server that stopped reading), read one status."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
            if then:
                sock.sendall(then)
        except OSError:
            pass  # the server answered (and closed) before reading everything: read it
        return _read_status(sock)


def raw_http_in_a_row(port: int, requests: list[bytes]) -> str:
    """Send `requests` one after the other on one kept-alive connection (so to one worker):
    their statuses, joined by commas, or where the connection failed."""
    statuses: list[str] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(ANSWER_TIMEOUT_S)
        buffer = b""
        for request in requests:
            try:
                sock.sendall(request)
                while b"\r\n\r\n" not in buffer:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return ",".join([*statuses, "closed"])
                    buffer += chunk
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
                while len(buffer) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return ",".join([*statuses, "closed"])
                    buffer += chunk
                buffer = buffer[length:]
                statuses.append(head.split(b" ", 2)[1].decode())
            except TimeoutError:
                return ",".join([*statuses, "no_answer"])
            except (ConnectionError, TypeError):
                return ",".join([*statuses, "closed"])
    return ",".join(sorted(set(statuses)))


def _post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return head.encode() + b"\r\n" + body


def _json_post(path: str, doc: object, headers: dict[str, str] | None = None) -> bytes:
    return _post(
        path, json.dumps(doc).encode(), {"content-type": "application/json", **(headers or {})}
    )


def _mlp_input(values: object, shape: list[int], datatype: str = "FP32") -> dict[str, object]:
    return {"inputs": [{"name": "input", "datatype": datatype, "shape": shape, "data": values}]}


def _binary_bytes(model: str, name: str, element: bytes, declared: int | None = None) -> bytes:
    """Triton's binary extension: one BYTES element (length-prefixed) after the JSON."""
    tensor = struct.pack("<I", len(element)) + element
    doc = {"inputs": [{"name": name, "datatype": "BYTES", "shape": [1, 1],
                       "parameters": {"binary_data_size": declared or len(tensor)}}]}  # fmt: skip
    header = json.dumps(doc).encode()
    return _post(
        f"/v2/models/{model}/infer",
        header + tensor,
        {"content-type": "application/octet-stream",
         "inference-header-content-length": str(len(header))},
    )  # fmt: skip


def _http(data: bytes, then: bytes = b"") -> Callable[[Target], str]:
    return lambda t: raw_http(t.http_port, data, then)


def _oversized(t: Target) -> str:
    size = (MAX_REQUEST_MIB + 1) << 20
    head = (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
        f"content-length: {size}\r\n\r\n"
    ).encode()
    return raw_http(t.http_port, head, b"[" * (1 << 20))


def _oversized_chunked(t: Target) -> str:
    """A body past the limit with no length announced: chunks until the server stops us."""
    head = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    chunk = b"100000\r\n" + b" " * 0x100000 + b"\r\n"
    return raw_http(t.http_port, head, chunk * (MAX_REQUEST_MIB + 1) + b"0\r\n\r\n")


# -- gRPC --------------------------------------------------------------------------------------


def _grpc_raw(method: str, payload: bytes) -> Callable[[Target], str]:
    def send(t: Target) -> str:
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        with grpc.insecure_channel(f"127.0.0.1:{t.grpc_port}", options=options) as channel:
            call = channel.unary_unary(SERVICE + method)
            try:
                call(payload, timeout=ANSWER_TIMEOUT_S)
            except grpc.RpcError as exc:
                return str(exc.code().name)
        return "OK"

    return send


def _infer_message(model: str, name: str, datatype: str, shape: list[int], raw: bytes) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = name, datatype
    tensor.shape.extend(shape)
    request.raw_input_contents.append(raw)
    out: bytes = request.SerializeToString()
    return out


def _grpc_in_a_row(method: str, payload: bytes, times: int) -> Callable[[Target], str]:
    """`times` calls on one channel (one connection, so one worker), statuses joined."""

    def send(t: Target) -> str:
        got = set()
        with grpc.insecure_channel(f"127.0.0.1:{t.grpc_port}") as channel:
            call = channel.unary_unary(SERVICE + method)
            for _ in range(times):
                try:
                    call(payload, timeout=ANSWER_TIMEOUT_S)
                    got.add("OK")
                except grpc.RpcError as exc:
                    got.add(str(exc.code().name))
        return ",".join(sorted(got))

    return send


def _utf8_message(model: str) -> bytes:
    element = struct.pack("<I", len(INVALID_UTF8)) + INVALID_UTF8
    return _infer_message(model, "text", "BYTES", [1, 1], element)


def _grpc_utf8(model: str) -> Callable[[Target], str]:
    return _grpc_raw("ModelInfer", _utf8_message(model))


def _grpc_stream_bad(t: Target) -> str:
    """A stream whose request has the wrong shape: the error comes on the stream."""
    answers: list[str] = []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{t.grpc_port}")
    try:
        client.start_stream(
            callback=lambda result, error: answers.append(
                "OK" if error is None else grpc_status(error)
            ),
            stream_timeout=ANSWER_TIMEOUT_S,
        )
        tensor = grpcclient.InferInput("input", [1, 63], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 63), np.float32))
        client.async_stream_infer("mlp", [tensor], request_id="bad")
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not answers and time.monotonic() < deadline:
            time.sleep(0.01)  # the stream's callback thread answers; bounded
    except InferenceServerException as exc:
        return grpc_status(exc)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return answers[0] if answers else "no_answer"


# -- the table -------------------------------------------------------------------------------

MLP = "/v2/models/mlp/infer"
JSON = {"content-type": "application/json"}
B400, B404 = frozenset({"400"}), frozenset({"404"})
INVALID = frozenset({"INVALID_ARGUMENT"})
TOO_LARGE = frozenset({"413", "closed"})  # answered before the body, or closed while sent
GARBAGE = bytes(random.Random(34).getrandbits(8) for _ in range(512))
ROW = [0.5] * 64


def _mlp_json(values: object, shape: list[int], headers: dict[str, str] | None = None) -> bytes:
    return _json_post(MLP, _mlp_input(values, shape), headers)


def _grpc_mlp(datatype: str, raw: bytes) -> Callable[[Target], str]:
    return _grpc_raw("ModelInfer", _infer_message("mlp", "input", datatype, [1, 64], raw))


def kinds() -> list[Hostile]:
    """Every kind, with the answers it may get."""
    h = Hostile
    binary = {"content-type": "application/octet-stream"}
    return [
        h("json_truncated", "http", B400, _http(_post(MLP, b'{"inputs": [{"name": "in', JSON))),
        h("json_garbage", "http", B400, _http(_post(MLP, GARBAGE, JSON))),
        h("json_wrong_type", "http", B400, _http(_mlp_json("abc", [1, 64]))),
        h("json_overflow_fp32", "http", B400, _http(_mlp_json([1e39] * 64, [1, 64]))),
        h("wrong_shape", "http", B400, _http(_mlp_json(ROW[:63], [1, 63]))),
        h("elements_mismatch", "http", B400, _http(_mlp_json(ROW, [100_000_000, 64]))),
        h("unknown_model", "http", B404, _http(_json_post("/v2/models/nope/infer", {}))),
        h("bad_timeout_header", "http", B400,
          _http(_mlp_json(ROW, [1, 64], {"inferd-timeout-ms": "inf"}))),
        h("binary_header_past_body", "http", B400,
          _http(_post(MLP, b"{}", {**binary, "inference-header-content-length": "99999"}))),
        h("binary_short_tensor", "http", B400,
          _http(_binary_bytes("text_stats", "text", b"abc", declared=4096))),
        h("invalid_utf8", "http", B400, _http(_binary_bytes("text_stats", "text", INVALID_UTF8))),
        # The model raises on it: its 500, or the server's 400 once it checks the text.
        h("invalid_utf8_raw_model", "http", frozenset({"400", "500"}),
          _http(_binary_bytes("text_stats_raw", "text", INVALID_UTF8))),
        # Issue 34's first finding: one client's bad inputs, in a row, must not take the
        # worker's readiness (the readiness probes watch it).
        h("invalid_utf8_raw_model_x6", "http", frozenset({"400", "500"}),
          lambda t: raw_http_in_a_row(
              t.http_port, [_binary_bytes("text_stats_raw", "text", INVALID_UTF8)] * IN_A_ROW)),
        h("grpc_invalid_utf8_raw_model_x6", "grpc", frozenset({"INVALID_ARGUMENT", "INTERNAL"}),
          _grpc_in_a_row("ModelInfer", _utf8_message("text_stats_raw"), IN_A_ROW)),
        h("huge_header", "http", frozenset({"431"}),
          _http(_mlp_json(ROW, [1, 64], {"x-pad": "a" * 40_000}))),
        h("bad_chunked", "http", frozenset({"400", "closed"}),
          _http(b"POST " + MLP.encode() + b" HTTP/1.1\r\nhost: soak\r\n"
                b"transfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")),
        h("oversized_body", "http", TOO_LARGE, _oversized, heavy=True),
        h("oversized_chunked", "http", TOO_LARGE, _oversized_chunked, heavy=True),
        h("grpc_garbage", "grpc", INVALID, _grpc_raw("ModelInfer", GARBAGE)),
        h("grpc_wrong_datatype", "grpc", INVALID, _grpc_mlp("INT32", bytes(256))),
        h("grpc_wrong_size", "grpc", INVALID, _grpc_mlp("FP32", bytes(100))),
        h("grpc_unknown_model", "grpc", frozenset({"NOT_FOUND"}),
          _grpc_raw("ModelInfer", _infer_message("nope", "input", "FP32", [1, 1], bytes(4)))),
        h("grpc_invalid_utf8", "grpc", INVALID, _grpc_utf8("text_stats")),
        h("grpc_invalid_utf8_raw_model", "grpc", frozenset({"INVALID_ARGUMENT", "INTERNAL"}),
          _grpc_utf8("text_stats_raw")),
        h("grpc_oversized", "grpc", frozenset({"RESOURCE_EXHAUSTED"}),
          _grpc_mlp("FP32", bytes((MAX_REQUEST_MIB + 1) << 20)), heavy=True),
        h("grpc_stream_bad", "grpc", frozenset({"stream_error"}), _grpc_stream_bad),
    ]  # fmt: skip


# -- slow clients ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlowKind:
    name: str
    limit_s: float  # the server's own limit for it (docs/limits.md)
    head: bytes  # sent at once
    trickle: bytes  # then one byte a second, while the connection stays open


SLOW_KINDS = (
    SlowKind("slow_head", 10.0, b"POST /v2/models/mlp/infer HTTP/1.1\r\n",
             b"x-slow: " + b"a" * 200),
    SlowKind("stalled_body", 30.0, b"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: soak\r\n"
             b"content-type: application/json\r\ncontent-length: 4000\r\n\r\n" + b"[" * 100, b""),
    SlowKind("idle", 5.0, b"", b""),
)  # fmt: skip


def slow_client(port: int, kind: SlowKind, stop: Callable[[], bool]) -> tuple[str, float]:
    """Hold one connection the slow way until the server closes it: (`closed` or the status it
    answered, or `kept` past its limit and the margin; seconds it was held)."""
    started = time.monotonic()
    give_up = started + kind.limit_s + SLOW_MARGIN_S
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(1.0)
        try:
            if kind.head:
                sock.sendall(kind.head)
            for i in range(10**6):
                if time.monotonic() > give_up:
                    return "kept", time.monotonic() - started
                if stop():
                    return "stopped", time.monotonic() - started
                try:
                    data = sock.recv(4096)
                except TimeoutError:
                    if kind.trickle:
                        sock.sendall(
                            kind.trickle[i % len(kind.trickle) : i % len(kind.trickle) + 1]
                        )
                    continue
                if not data:
                    return "closed", time.monotonic() - started
                parts = data.split(b"\r\n", 1)[0].split()
                return (
                    parts[1].decode() if len(parts) > 1 else "closed"
                ), time.monotonic() - started
        except ConnectionError:
            return "closed", time.monotonic() - started
    return "kept", time.monotonic() - started
