"""`inferd serve`'s capture options (docs/capture.md), and the settings they make."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferd.monitoring.capture_options import DEFAULT_CAPTURE_MAX_BYTES, CaptureSettings

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


def capture_settings(args: argparse.Namespace) -> CaptureSettings:
    return CaptureSettings(args.capture_dir, int(args.capture_max_mib * MIB))
