"""An `InferdError` on the gRPC wire: the one rule every gRPC path answers failures with.

A call fails with a status code from one ErrorKind table (Triton's mapping) and details of
`client_message` (protocol/error_text.py); trailing metadata set before the failure (traceparent)
goes with it. A stream's error is a message on the stream, not a status: its text is the
same `details`. The servicer's methods (protocol/grpc/service.py), the admin service, the access
interceptor (access_interceptor.py) and the message parser (handlers.py) all call `abort`.
"""

from __future__ import annotations

from typing import NamedTuple, NoReturn

import grpc

from inferd.errors import ErrorKind, InferdError
from inferd.protocol.error_text import client_message

STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,  # Triton's mapping of UNSUPPORTED
    ErrorKind.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.MODEL_ERROR: grpc.StatusCode.INTERNAL,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
}
INTERNAL_DETAILS = "internal error; see the server log"  # an unhandled exception


class GrpcError(NamedTuple):
    code: grpc.StatusCode
    details: str


def grpc_error(exc: InferdError) -> GrpcError:
    """`exc` as a gRPC status (see the module docstring)."""
    return GrpcError(STATUS[exc.kind], client_message(exc))


async def abort(context: grpc.aio.ServicerContext, exc: InferdError) -> NoReturn:
    """End the call with `exc`'s status (grpc.aio's abort raises)."""
    code, details = grpc_error(exc)
    await context.abort(code, details)
    raise AssertionError("unreachable: abort raises")


async def abort_internal(context: grpc.aio.ServicerContext) -> NoReturn:
    """End the call after an unhandled exception (logged by the caller)."""
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_DETAILS)
    raise AssertionError("unreachable: abort raises")
