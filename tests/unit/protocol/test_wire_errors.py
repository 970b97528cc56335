"""One InferdError -> wire rule per protocol (protocol/http/error_responses.py,
protocol/grpc/error_status.py), over
one case table of every error kind."""

from __future__ import annotations

import grpc
import orjson
import pytest

from inferd.errors import ErrorKind, InferdError
from inferd.protocol.grpc.error_status import grpc_error
from inferd.protocol.http.error_responses import http_error

SHED = [(b"retry-after", b"1")]
CHALLENGE = [(b"www-authenticate", b'Bearer realm="inferd"')]
Code = grpc.StatusCode
# kind, HTTP status, HTTP headers, gRPC code (Triton's mappings)
CASES: list[tuple[ErrorKind, int, list[tuple[bytes, bytes]], grpc.StatusCode]] = [
    (ErrorKind.INVALID_ARGUMENT, 400, [], Code.INVALID_ARGUMENT),
    (ErrorKind.UNAUTHENTICATED, 401, CHALLENGE, Code.UNAUTHENTICATED),
    (ErrorKind.PERMISSION_DENIED, 403, [], Code.PERMISSION_DENIED),
    (ErrorKind.UNSUPPORTED, 400, [], Code.UNIMPLEMENTED),
    (ErrorKind.NOT_FOUND, 404, [], Code.NOT_FOUND),
    (ErrorKind.ALREADY_EXISTS, 400, [], Code.ALREADY_EXISTS),
    (ErrorKind.PAYLOAD_TOO_LARGE, 413, [], Code.RESOURCE_EXHAUSTED),
    (ErrorKind.RESOURCE_EXHAUSTED, 429, SHED, Code.RESOURCE_EXHAUSTED),
    (ErrorKind.MODEL_ERROR, 500, [], Code.INTERNAL),
    (ErrorKind.INTERNAL, 500, [], Code.INTERNAL),
    (ErrorKind.UNAVAILABLE, 503, [], Code.UNAVAILABLE),
    (ErrorKind.DEADLINE_EXCEEDED, 504, [], Code.DEADLINE_EXCEEDED),
]


def test_the_table_covers_every_kind() -> None:
    assert {case[0] for case in CASES} == set(ErrorKind)


@pytest.mark.parametrize(("kind", "status", "headers", "code"), CASES)
def test_http(
    kind: ErrorKind, status: int, headers: list[tuple[bytes, bytes]], code: grpc.StatusCode
) -> None:
    error = http_error(InferdError(kind, "model 'm' is wrong"))
    assert (error.status, error.headers) == (status, headers)
    assert orjson.loads(error.body) == {"error": "model 'm' is wrong"}


@pytest.mark.parametrize(("kind", "status", "headers", "code"), CASES)
def test_grpc(
    kind: ErrorKind, status: int, headers: list[tuple[bytes, bytes]], code: grpc.StatusCode
) -> None:
    assert grpc_error(InferdError(kind, "model 'm' is wrong")) == (code, "model 'm' is wrong")


def test_headers_are_the_callers_to_extend() -> None:
    first = http_error(InferdError(ErrorKind.RESOURCE_EXHAUSTED, "shed"))
    first.headers.append((b"traceparent", b"00-x"))
    assert http_error(InferdError(ErrorKind.RESOURCE_EXHAUSTED, "shed")).headers == SHED


@pytest.mark.parametrize("kind", [ErrorKind.MODEL_ERROR, ErrorKind.INTERNAL])
def test_a_models_text_is_the_client_message_on_both(kind: ErrorKind) -> None:
    exc = InferdError(kind, "failed in /srv/models/m/1/model.py\nsecond line")
    text = "failed in <path>/model.py second line"
    assert orjson.loads(http_error(exc).body) == {"error": text}
    assert grpc_error(exc).details == text
