"""Server settings: one frozen value built by the CLI (or by tests) and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    model_repository: Path = Path("examples/models")
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = 8001  # None: no gRPC endpoint; 0: any free port (tests)
    max_request_bytes: int = 64 * MIB  # HTTP bodies and received gRPC messages
    max_response_bytes: int = 64 * MIB  # sent gRPC messages
    log_level: str = "INFO"
    exit_timeout_s: float = 30.0
