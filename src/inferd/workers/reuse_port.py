"""The HTTP port the processes of `--workers N` (and `--engine`'s front ends) share."""

from __future__ import annotations

import socket

from inferd.settings import Settings


def reuse_port_socket(settings: Settings) -> socket.socket:
    """The HTTP port, shared with sibling processes (SO_REUSEPORT). Bound, not listening:
    the kernel hands this process connections only once uvicorn listens, after its lifespan
    started (models loaded, or the engine reached); until then its siblings take them all."""
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((settings.host, settings.http_port))
    return sock
