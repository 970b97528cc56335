"""The `inferd tune` arguments the tune tests share."""

from __future__ import annotations

import argparse

from inferd_tools.tune.main import add_tune_parser


def tune_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferd")
    add_tune_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["tune", *argv])
