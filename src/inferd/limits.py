"""Bounds on what a client controls at the transport: one frozen value in Settings.

Every field is an `inferd serve` option (cli/limit_options.py) and a row of docs/limits.md, which
names the error each one gives. The request and response sizes stay in Settings
(`max_request_bytes`, `max_response_bytes`), where they were first.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from inferd.errors import ErrorKind, InferdError

log = logging.getLogger("inferd.limits")

KIB = 1024
MIB = 1024 * KIB

# Connections past --max-connections still get this many more for /v2/health/* (and a fast
# 429 for anything else), so a load balancer's probes are answered during a connection flood.
HEALTH_RESERVE = 32
# File descriptors beyond the connections: models, gRPC, logs, worker pipes.
FD_HEADROOM = 512


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 32 * KIB  # a request's line and headers together
    max_header_count: int = 100  # header fields in one request
    max_url_bytes: int = 8 * KIB  # the request target
    header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers
    body_timeout_s: float = 30.0  # the longest pause while a request body arrives
    keep_alive_timeout_s: float = 5.0  # an idle connection (before or between requests)
    max_connections: int = 1000  # HTTP connections open at once (per process)
    max_bytes_elements: int = 1 << 20  # elements of one BYTES tensor
    max_stream_pending: int = 64  # unanswered requests of one gRPC ModelStreamInfer stream
    offload_bytes: int = 1 * MIB  # requests and responses this large are coded off the loop


DEFAULT_LIMITS = Limits()


def ensure_file_descriptors(limits: Limits) -> None:
    """Raise the soft file-descriptor limit (up to the hard one) so the connection limit,
    not the kernel's EMFILE, is what refuses a connection flood; warn if it cannot."""
    needed = limits.max_connections + HEALTH_RESERVE + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open-file limit is %d, below the %d that --max-connections %d needs; "
            "a connection flood may exhaust it (raise `ulimit -n` or lower --max-connections)",
            soft,
            needed,
            limits.max_connections,
        )


def response_too_large(size: int, limit: int, at_least: bool = False) -> InferdError:
    """A response is bounded like a request: a client's choice of outputs and batch must not
    make the server build (and hold) an answer of any size. The error for a response of
    `size` bytes past `limit`; callers compare inline (`if limit and size > limit`), as the
    check runs on every response and the error on few."""
    return InferdError(
        ErrorKind.PAYLOAD_TOO_LARGE,
        f"the response takes {'at least ' if at_least else ''}{size} bytes, more than the "
        f"limit of {limit} bytes (--max-response-mib); ask for fewer outputs or rows",
    )
