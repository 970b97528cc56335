"""Logging setup only."""

from __future__ import annotations

import logging
import sys


def configure(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger("inferd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
