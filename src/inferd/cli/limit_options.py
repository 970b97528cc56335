"""The `inferd serve` options for inferd.limits.Limits: defined once, read back into one value."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from inferd.limits import KIB, Limits


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


_INT = _positive(int)
_FLOAT = _positive(float)


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    d = Limits()
    group = parser.add_argument_group(
        "client limits", "bounds on what one client controls (docs/limits.md names each error)"
    )
    group.add_argument(
        "--max-header-kib",
        type=_FLOAT,
        default=d.max_header_bytes / KIB,
        help="largest request line plus headers of one HTTP request, in KiB (431 past it)",
    )
    group.add_argument(
        "--max-header-count",
        type=_INT,
        default=d.max_header_count,
        help="most header fields in one HTTP request (431 past it)",
    )
    group.add_argument(
        "--max-url-kib",
        type=_FLOAT,
        default=d.max_url_bytes / KIB,
        help="longest HTTP request target, in KiB (414 past it)",
    )
    group.add_argument(
        "--header-timeout-secs",
        type=_FLOAT,
        default=d.header_timeout_s,
        help="time from a request's first byte to the end of its headers (408 past it)",
    )
    group.add_argument(
        "--body-timeout-secs",
        type=_FLOAT,
        default=d.body_timeout_s,
        help="longest pause while an HTTP request body arrives (408 past it)",
    )
    group.add_argument(
        "--keep-alive-timeout-secs",
        type=_FLOAT,
        default=d.keep_alive_timeout_s,
        help="an HTTP connection idle this long (before or between requests) is closed",
    )
    group.add_argument(
        "--max-connections",
        type=_INT,
        default=d.max_connections,
        help="HTTP connections open at once; past it health probes are still answered "
        "(a small reserve) and other requests get 429",
    )
    group.add_argument(
        "--max-bytes-elements",
        type=_INT,
        default=d.max_bytes_elements,
        help="most elements of one BYTES tensor in a request (400 past it)",
    )
    group.add_argument(
        "--max-stream-pending",
        type=_INT,
        default=d.max_stream_pending,
        help="unanswered requests of one gRPC ModelStreamInfer stream; past it the server "
        "stops reading the stream until the client reads its responses",
    )
    group.add_argument(
        "--offload-threshold-kib",
        type=_FLOAT,
        default=d.offload_bytes / KIB,
        help="requests and responses at least this large are decoded and encoded off the "
        "event loop, so they delay only themselves",
    )


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(
        max_header_bytes=int(args.max_header_kib * KIB),
        max_header_count=int(args.max_header_count),
        max_url_bytes=int(args.max_url_kib * KIB),
        header_timeout_s=args.header_timeout_secs,
        body_timeout_s=args.body_timeout_secs,
        keep_alive_timeout_s=args.keep_alive_timeout_secs,
        max_connections=int(args.max_connections),
        max_bytes_elements=int(args.max_bytes_elements),
        max_stream_pending=int(args.max_stream_pending),
        offload_bytes=int(args.offload_threshold_kib * KIB),
    )
