"""The options that shape each request, shared by `inferd bench` and `inferd tune` (which
measures with the bench engine). Kept free of heavy imports: every `inferd` command builds
the parser."""

from __future__ import annotations

import argparse


def add_request_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http-binary",
        action="store_true",
        help="HTTP: send tensors with the binary tensor extension and ask for binary outputs "
        "(what perf_analyzer does); default: JSON",
    )
    parser.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE.json",
        help='input values: random, zeros, or a JSON file {"input name": [values...]}',
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2",
        help="shape of an input with variable dims, without the batch dim (repeatable)",
    )
    parser.add_argument("-b", "--batch-size", type=int, default=1, help="rows per request")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per-request timeout")
