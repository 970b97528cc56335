"""An `InferdError` on the HTTP wire: the one rule every HTTP path answers failures with.

Status from one ErrorKind table (Triton's mapping), headers a client or load balancer acts
on (`Retry-After` when shed, `WWW-Authenticate` when a credential is missing), and the body
`{"error": <client_message>}`. The routes (protocol/http/routes.py), the infer route under any
HTTP server (infer_route.py) and the generate extension (generate.py) all call `http_error`.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson

from inferd.errors import ErrorKind, InferdError
from inferd.protocol.error_text import client_message

STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.PERMISSION_DENIED: 403,
    ErrorKind.UNSUPPORTED: 400,  # Triton's mapping of UNSUPPORTED
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.ALREADY_EXISTS: 400,  # as Triton's HTTP server answers ALREADY_EXISTS
    ErrorKind.PAYLOAD_TOO_LARGE: 413,
    ErrorKind.RESOURCE_EXHAUSTED: 429,
    ErrorKind.MODEL_ERROR: 500,
    ErrorKind.INTERNAL: 500,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.DEADLINE_EXCEEDED: 504,
}

Headers = list[tuple[bytes, bytes]]  # (lower-case name, value), as ASGI and the raw wire
# Shed load: "retry later", which load balancers and clients act on.
RETRY_AFTER: tuple[bytes, bytes] = (b"retry-after", b"1")
# A 401 names the scheme that would be accepted (RFC 9110); the message says which header.
CHALLENGE: tuple[bytes, bytes] = (b"www-authenticate", b'Bearer realm="inferd"')
_KIND_HEADERS: dict[ErrorKind, Headers] = {
    ErrorKind.RESOURCE_EXHAUSTED: [RETRY_AFTER],
    ErrorKind.UNAUTHENTICATED: [CHALLENGE],
}
INTERNAL_BODY = b'{"error":"internal error; see the server log"}'  # an unhandled exception


class HttpError(NamedTuple):
    status: int
    headers: Headers  # a fresh list: the caller may add its own (traceparent)
    body: bytes  # application/json


def http_error(exc: InferdError) -> HttpError:
    """`exc` as an HTTP answer (see the module docstring)."""
    body = orjson.dumps({"error": client_message(exc)})
    return HttpError(STATUS[exc.kind], list(_KIND_HEADERS.get(exc.kind, ())), body)


def message_body(message: str) -> bytes:
    """The body of an error that is no InferdError (a 404 route, a refused path)."""
    return orjson.dumps({"error": message})
