"""Server settings: one frozen value built by the CLI (or by tests) and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.limits import Limits
from inferd.monitoring.capture_settings import CaptureSettings
from inferd.telemetry.trace_config import TraceConfig

if TYPE_CHECKING:
    from inferd.cache.cache_settings import CacheSettings

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of one TLS endpoint."""

    cert: Path  # the server's certificate (chain)
    key: Path  # its private key
    client_ca: Path | None = None  # set: clients must present a certificate it signed (mTLS)


@dataclass(frozen=True, slots=True)
class Settings:
    model_repository: Path = Path("examples/models")
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = 8001  # None: no gRPC endpoint; 0: any free port (tests)
    max_request_bytes: int = 64 * MIB  # HTTP bodies and received gRPC messages
    max_response_bytes: int = 64 * MIB  # HTTP response bodies and sent gRPC messages
    log_level: str = "INFO"
    log_format: str = "text"  # "text" or "json" (one JSON object per line)
    log_sample_rate: float = 0.01  # share of successful requests logged; errors always are
    metrics_port: int | None = 8002  # None: no metrics endpoint; 0: any free port (tests)
    metrics_triton_names: bool = False  # also export Triton's nv_* names (model and host)
    # --trace-config / --trace-otlp-endpoint: a Triton trace file or OpenTelemetry spans
    # (telemetry/trace_config.py); by default no tracing.
    trace: TraceConfig = TraceConfig()
    exit_timeout_s: float = 30.0
    # Default for models whose config sets no execution_timeout_ms; 0: none (reliability.md).
    execution_timeout_ms: int = 120_000
    # Model error text sent to clients whole (paths, tracebacks); off: sanitised
    # (protocol/error_text.py).
    verbose_errors: bool = False
    max_inflight_requests: int = 0  # server-wide; past it requests are shed (429); 0: none
    model_control_mode: str = "none"  # Triton's: none, poll or explicit
    repository_poll_s: float = 15.0  # poll mode's interval
    load_models: tuple[str, ...] = ()  # explicit mode: loaded at start ("*": all)
    workers: int = 1  # processes serving the repository, sharing the ports (SO_REUSEPORT)
    engine: bool = False  # with workers > 1: they are front ends of one engine (inferd.engine)
    admin_api: bool | None = None  # repository load/unload and routing; None: explicit only
    docs_ui: bool = True  # GET /docs: Swagger UI over GET /v2/openapi.json (docs/openapi.md)
    # Security (docs/security.md).
    http_restricted_api: tuple[str, ...] = ()  # Triton's "API[,API]:KEY=VALUE" restrictions
    grpc_restricted_protocol: tuple[str, ...] = ()
    admin_token: str = field(default="", repr=False)  # bearer token of the admin APIs
    model_upload: str = "off"  # load's `file:` parameters: "off", "files" or "code"
    http_tls: TlsFiles | None = None
    grpc_tls: TlsFiles | None = None
    limits: Limits = Limits()  # headers, timeouts, connections, streams (inferd.limits)
    capture: CaptureSettings = CaptureSettings()  # --capture-dir, --capture-max-mib
    # --cache-config: the response cache's tiers (docs/cache.md); None: no cache.
    cache: CacheSettings | None = None
