"""Where the engine listens, in the supervisor's private directory (0700): the hop, and its
own HTTP and gRPC adapters for what front ends pass on (http_proxy.py, grpc_proxy.py)."""

from __future__ import annotations

from pathlib import Path

HOP = "engine.sock"
HTTP = "engine-http.sock"
GRPC = "engine-grpc.sock"


def hop(directory: Path) -> Path:
    return directory / HOP


def http(directory: Path) -> Path:
    return directory / HTTP


def grpc(directory: Path) -> Path:
    return directory / GRPC
