"""`inferd serve`'s capture options (docs/capture.md), and the settings they make."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from inferd.monitoring.capture_settings import (
    DEFAULT_CAPTURE_MAX_BYTES,
    DEFAULT_REDIS_MAXLEN,
    DEFAULT_REDIS_STREAM,
    CaptureOptionError,
    CaptureSettings,
)

MIB = 1024 * 1024


def _positive_mib(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a number of MiB > 0")
    return value


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--capture-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the requests each model samples (its parameter capture_sample_rate) and "
        "their responses to DIR, as .npz shards and an index, off the request path "
        "(docs/capture.md). Unset: sampled requests feed feedback only",
    )
    parser.add_argument(
        "--capture-max-mib",
        type=_positive_mib,
        default=DEFAULT_CAPTURE_MAX_BYTES / MIB,
        metavar="MIB",
        help="bound on the capture shards in --capture-dir: past it the oldest are removed",
    )
    parser.add_argument(
        "--capture-redis",
        default="",
        metavar="URL",
        help="also send sampled requests to a Redis stream (redis://HOST:PORT/DB; needs the "
        "redis extra), capped at --capture-redis-maxlen entries. Empty: not",
    )
    parser.add_argument(
        "--capture-redis-stream",
        default=DEFAULT_REDIS_STREAM,
        metavar="KEY",
        help="the key of --capture-redis's stream",
    )
    parser.add_argument(
        "--capture-redis-maxlen",
        type=int,
        default=DEFAULT_REDIS_MAXLEN,
        metavar="N",
        help="entries --capture-redis's stream keeps (XADD MAXLEN, exact): the oldest go",
    )


def capture_settings(args: argparse.Namespace) -> CaptureSettings:
    """The settings; CaptureOptionError, naming the option, for one inferd cannot honour."""
    if args.capture_redis:
        if importlib.util.find_spec("redis") is None:
            raise CaptureOptionError(
                "--capture-redis needs the redis client: pip install 'inferd[redis]'"
            )
        if not args.capture_redis.startswith(("redis://", "rediss://", "unix://")):
            raise CaptureOptionError(
                f"--capture-redis {args.capture_redis!r}: expected a redis://HOST:PORT/DB "
                "(or rediss://, unix://) URL"
            )
        if args.capture_redis_maxlen < 1:
            raise CaptureOptionError("--capture-redis-maxlen must be at least 1 (entries)")
    return CaptureSettings(
        args.capture_dir,
        int(args.capture_max_mib * MIB),
        args.capture_redis,
        args.capture_redis_stream,
        args.capture_redis_maxlen,
    )
