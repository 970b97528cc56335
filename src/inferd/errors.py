"""One protocol-neutral error type; each adapter maps `ErrorKind` to its own status table."""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"  # the request is wrong: fix it, don't retry
    NOT_FOUND = "not_found"  # no such model or version
    UNAUTHENTICATED = "unauthenticated"  # a restricted API called without its credential
    ALREADY_EXISTS = "already_exists"  # a name registered twice (a shared-memory region)
    PERMISSION_DENIED = "permission_denied"  # an admin call or upload the server has turned off
    UNSUPPORTED = "unsupported"  # this endpoint cannot serve this model (a decoupled one)
    UNAVAILABLE = "unavailable"  # the model cannot serve right now (not ready, unloading)
    RESOURCE_EXHAUSTED = "resource_exhausted"  # shed: retry later
    PAYLOAD_TOO_LARGE = "payload_too_large"  # body over the configured limit
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MODEL_ERROR = "model_error"  # the model's own code raised
    INTERNAL = "internal"  # a bug in inferd


class InferdError(Exception):
    """An error that reaches the client with a kind and a message naming what was wrong."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class DeadlineUnmeetableError(InferdError):
    """A request refused because the model would not answer it within its deadline;
    `estimate_s` is how long the model would have taken (degradation tiers count it as a
    request that slow: a model whose clients' deadlines it cannot meet is slow for them)."""

    def __init__(self, kind: ErrorKind, message: str, estimate_s: float) -> None:
        super().__init__(kind, message)
        self.estimate_s = estimate_s


def invalid(message: str) -> InferdError:
    return InferdError(ErrorKind.INVALID_ARGUMENT, message)


def not_found(message: str) -> InferdError:
    return InferdError(ErrorKind.NOT_FOUND, message)


def unavailable(message: str) -> InferdError:
    return InferdError(ErrorKind.UNAVAILABLE, message)


def shed(message: str) -> InferdError:
    """Load shedding: the client should retry later (HTTP 429 + Retry-After)."""
    return InferdError(ErrorKind.RESOURCE_EXHAUSTED, message)


def deadline_exceeded(message: str) -> InferdError:
    return InferdError(ErrorKind.DEADLINE_EXCEEDED, message)
