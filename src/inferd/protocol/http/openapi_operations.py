"""What each HTTP route takes and answers, for the OpenAPI document: one entry per route
and method that protocol/http/routes.py serves (a test holds the two tables together).

An entry names its request body's schema (openapi_schemas.py), its answers by status, and
whether the route exists only with a feature on: `admin` (the repository API and every
change to the trace and log settings: `--admin-api on` or explicit model control) or `shm`
(Triton's shared-memory registration: a server of one process). Statuses are the ones the
route can answer besides 401, which every restricted route adds (openapi_document.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = "application/json"
BINARY = "application/octet-stream"
EVENTS = "text/event-stream"
HTML = "text/html"

# What a failure says, by status (each with the `error` body).
ERRORS = {
    400: "Bad request: the message names the field",
    401: "A restricted API called without its credential (WWW-Authenticate: Bearer)",
    403: "Turned off on this server: the message names the option",
    404: "No such model, version or region",
    413: "The body exceeds --max-request-mib (or the answer --max-response-mib)",
    429: "Shed: retry later (Retry-After)",
    500: "The model failed (its error, sanitised unless --verbose-errors)",
    503: "The model cannot serve now (not ready, unloading)",
    504: "The request's deadline passed",
}
# The answers of a route that runs a model.
INFER_ERRORS = (400, 404, 413, 429, 500, 503, 504)


@dataclass(frozen=True, slots=True)
class Operation:
    operation_id: str
    summary: str
    tag: str
    ok: dict[int, dict[str, Any]]  # status -> media type -> schema (no content: {})
    errors: tuple[int, ...] = ()
    body: str | None = None  # the request's schema (a component), JSON
    body_required: bool = False
    body_types: tuple[str, ...] = (JSON,)  # media types the body may have
    needs: str = ""  # "admin" or "shm": served only with that feature on
    headers: tuple[str, ...] = ()  # request headers it reads (HEADERS below)
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _json(schema: str) -> dict[str, Any]:
    return {JSON: {"$ref": f"#/components/schemas/{schema}"}}


_STATUS_ONLY: dict[int, dict[str, Any]] = {200: {}}
_READY: dict[int, dict[str, Any]] = {200: {}, 503: {}}

# Request headers, as OpenAPI parameters.
HEADERS: dict[str, dict[str, Any]] = {
    "inference-header-content-length": {
        "description": "binary tensor extension: the length of the JSON header that "
        "precedes the binary data",
        "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"},
    },
    "inferd-timeout-ms": {
        "description": "the request's deadline, in milliseconds (504 past it)",
        "schema": {"type": "string", "pattern": r"^[0-9]{1,10}(\.[0-9]{1,20})?$"},
    },
    "inferd-routing-key": {
        "description": "makes canary routing sticky: one key, one version",
        "schema": {"type": "string"},
    },
    "traceparent": {
        "description": "W3C trace context (echoed back when valid)",
        "schema": {"type": "string"},
    },
}
_INFER_HEADERS = tuple(HEADERS)
_GENERATE_HEADERS = ("inferd-timeout-ms", "inferd-routing-key", "traceparent")

_M = "/v2/models/{model}"
_MV = "/v2/models/{model}/versions/{version}"
_SYS = "/v2/systemsharedmemory"
_CUDA = "/v2/cudasharedmemory"

INFER = Operation(
    "infer",
    "Inference (any model; each model's own request is under its name)",
    "inference",
    {200: {**_json("inference_response"), BINARY: {"type": "string", "format": "binary"}}},
    INFER_ERRORS,
    body="inference_request",
    body_required=True,
    body_types=(JSON, BINARY),
    headers=_INFER_HEADERS,
    description="KServe v2 inference. With Triton's binary tensor extension the body is "
    "the JSON header, then the tensors' bytes (`Inference-Header-Content-Length` says where "
    "the JSON ends); so is the answer when an output asks for binary data.",
)
_GENERATE = Operation(
    "generate",
    "Generate (Triton's generate extension): one response",
    "inference",
    {200: _json("generate_response")},
    INFER_ERRORS,
    body="generate_request",
    body_required=True,
    headers=_GENERATE_HEADERS,
)
GENERATE_STREAM = Operation(
    "generate_stream",
    "Generate, streamed: one server-sent event per response",
    "inference",
    {200: {EVENTS: {"$ref": "#/components/schemas/generate_event"}}},
    INFER_ERRORS,
    body="generate_request",
    body_required=True,
    headers=_GENERATE_HEADERS,
)


def _versioned(op: Operation, suffix: str = "_version") -> Operation:
    return Operation(
        op.operation_id + suffix,
        op.summary + " (a given version)",
        op.tag,
        op.ok,
        op.errors,
        op.body,
        op.body_required,
        op.body_types,
        op.needs,
        op.headers,
        op.description,
    )


_MODEL_METADATA = Operation(
    "model_metadata",
    "Model metadata",
    "metadata",
    {200: _json("metadata_model_response")},
    (404, 503),
)
_MODEL_READY = Operation("model_ready", "Model ready (200) or not (503)", "health", _READY, (404,))
_MODEL_CONFIG = Operation(
    "model_config",
    "Model configuration (Triton's extension)",
    "metadata",
    {200: _json("model_config")},
    (404, 503),
)
_MODEL_STATS = Operation(
    "model_statistics",
    "A model's statistics (Triton's extension)",
    "statistics",
    {200: _json("statistics_response")},
    (404,),
)
_TRACE_GET = Operation(
    "model_trace_settings",
    "A model's trace settings",
    "trace",
    {200: _json("trace_settings")},
    (404,),
)
_TRACE_POST = Operation(
    "set_model_trace_settings",
    "Change a model's trace settings",
    "trace",
    {200: _json("trace_settings")},
    (400, 404, 413),
    body="trace_settings",
    needs="admin",
)
_DRIFT = Operation(
    "drift",
    "The model's drift report (docs/monitoring.md)",
    "monitoring",
    {200: _json("drift_response")},
    (404, 503),
)
_DRIFT_REFERENCE = Operation(
    "set_drift_reference",
    "Set a drift reference: an .npz archive, or tensors as JSON",
    "monitoring",
    {200: _json("drift_response")},
    (400, 404, 413, 503),
    body="drift_reference_request",
    body_required=True,
    body_types=(JSON, BINARY),
    needs="admin",
)
_SHM_STATUS = Operation(
    "system_shared_memory_status",
    "Registered system shared-memory regions",
    "shared memory",
    {200: _json("shared_memory_status_response")},
    (404,),
    needs="shm",
)
_SHM_UNREGISTER = Operation(
    "system_shared_memory_unregister",
    "Unregister a system shared-memory region (or all)",
    "shared memory",
    _STATUS_ONLY,
    (400, 413),
    body="ignored_body",
    needs="shm",
)
_CUDA_STATUS = Operation(
    "cuda_shared_memory_status",
    "CUDA shared-memory regions (none: inferd holds no CUDA memory)",
    "shared memory",
    {200: _json("shared_memory_status_response")},
    (404,),
    needs="shm",
)
_CUDA_UNREGISTER = Operation(
    "cuda_shared_memory_unregister",
    "Unregister a CUDA shared-memory region (none exist)",
    "shared memory",
    _STATUS_ONLY,
    (400, 413),
    body="ignored_body",
    needs="shm",
)


def _named(op: Operation, operation_id: str, summary: str) -> Operation:
    """`op` under another id: one route table entry per (path, method)."""
    return Operation(
        operation_id,
        summary,
        op.tag,
        op.ok,
        op.errors,
        op.body,
        op.body_required,
        op.body_types,
        op.needs,
        op.headers,
        op.description,
    )


# (method, path) -> what it takes and answers.
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/v2/health/live"): Operation(
        "server_live", "Server live (200) or not (503)", "health", _READY
    ),
    ("GET", "/v2/health/ready"): Operation(
        "server_ready",
        "Server ready (200: every model can serve) or not (503)",
        "health",
        _READY,
    ),
    ("GET", "/v2"): Operation(
        "server_metadata", "Server metadata", "metadata", {200: _json("metadata_server_response")}
    ),
    ("GET", _M): _MODEL_METADATA,
    ("GET", _MV): _versioned(_MODEL_METADATA),
    ("GET", _M + "/ready"): _MODEL_READY,
    ("GET", _MV + "/ready"): _versioned(_MODEL_READY),
    ("GET", _M + "/config"): _MODEL_CONFIG,
    ("GET", _MV + "/config"): _versioned(_MODEL_CONFIG),
    ("GET", "/v2/models/stats"): Operation(
        "statistics",
        "Every model's statistics (Triton's extension)",
        "statistics",
        {200: _json("statistics_response")},
    ),
    ("GET", _M + "/stats"): _MODEL_STATS,
    ("GET", _MV + "/stats"): _versioned(_MODEL_STATS),
    ("POST", _M + "/feedback"): Operation(
        "feedback",
        "A ground-truth label for a captured prediction (docs/capture.md)",
        "monitoring",
        {200: _json("feedback_response")},
        (400, 404, 413),
        body="feedback_request",
        body_required=True,
    ),
    ("POST", _M + "/infer"): INFER,
    ("POST", _MV + "/infer"): _versioned(INFER),
    ("POST", _M + "/generate"): _GENERATE,
    ("POST", _MV + "/generate"): _versioned(_GENERATE),
    ("POST", _M + "/generate_stream"): GENERATE_STREAM,
    ("POST", _MV + "/generate_stream"): _versioned(GENERATE_STREAM),
    ("POST", "/v2/repository/index"): Operation(
        "repository_index",
        "The models in the repository and their states",
        "model repository",
        {200: _json("repository_index_response")},
        (400, 413),
        body="repository_index_request",
    ),
    ("POST", "/v2/repository/models/{model}/load"): Operation(
        "load_model",
        "Load or reload a model (optionally with its config and files)",
        "model repository",
        _STATUS_ONLY,
        (400, 403, 404, 413),
        body="repository_load_request",
        needs="admin",
        extra={"example": {}},
    ),
    ("POST", "/v2/repository/models/{model}/unload"): Operation(
        "unload_model",
        "Unload a model: it drains and stays listed as unloaded",
        "model repository",
        _STATUS_ONLY,
        (400, 404, 413),
        body="repository_unload_request",
        needs="admin",
    ),
    ("GET", _M + "/routing"): Operation(
        "routing",
        "Traffic weights between the model's versions",
        "model repository",
        {200: _json("routing_response")},
        (404,),
    ),
    ("POST", _M + "/routing"): Operation(
        "set_routing",
        "Set traffic weights between the model's versions",
        "model repository",
        {200: _json("routing_response")},
        (400, 404, 413),
        body="routing_request",
        body_required=True,
        needs="admin",
    ),
    ("POST", _M + "/routing/promote"): Operation(
        "promote",
        "Send all traffic to a version",
        "model repository",
        {200: _json("routing_response")},
        (400, 404, 413),
        body="version_request",
        body_required=True,
        needs="admin",
    ),
    ("POST", _M + "/routing/rollback"): Operation(
        "rollback",
        "Undo the last step forward (or back to a version)",
        "model repository",
        {200: _json("routing_response")},
        (400, 404, 413),
        body="version_request",
        needs="admin",
    ),
    ("GET", f"{_SYS}/status"): _SHM_STATUS,
    ("GET", f"{_SYS}/region/{{region}}/status"): _named(
        _SHM_STATUS, "system_shared_memory_region_status", "One system shared-memory region"
    ),
    ("POST", f"{_SYS}/region/{{region}}/register"): Operation(
        "system_shared_memory_register",
        "Register a system shared-memory region",
        "shared memory",
        _STATUS_ONLY,
        (400, 413),
        body="system_shared_memory_register_request",
        body_required=True,
        needs="shm",
    ),
    ("POST", f"{_SYS}/unregister"): _SHM_UNREGISTER,
    ("POST", f"{_SYS}/region/{{region}}/unregister"): _named(
        _SHM_UNREGISTER,
        "system_shared_memory_region_unregister",
        "Unregister a system shared-memory region",
    ),
    ("GET", f"{_CUDA}/status"): _CUDA_STATUS,
    ("GET", f"{_CUDA}/region/{{region}}/status"): _named(
        _CUDA_STATUS, "cuda_shared_memory_region_status", "One CUDA shared-memory region"
    ),
    ("POST", f"{_CUDA}/region/{{region}}/register"): Operation(
        "cuda_shared_memory_register",
        "Register a CUDA shared-memory region (refused: 400)",
        "shared memory",
        _STATUS_ONLY,
        (400, 413),
        body="cuda_shared_memory_register_request",
        needs="shm",
    ),
    ("POST", f"{_CUDA}/unregister"): _CUDA_UNREGISTER,
    ("POST", f"{_CUDA}/region/{{region}}/unregister"): _named(
        _CUDA_UNREGISTER,
        "cuda_shared_memory_region_unregister",
        "Unregister a CUDA shared-memory region (none exist)",
    ),
    ("GET", "/v2/trace/setting"): Operation(
        "trace_settings", "The global trace settings", "trace", {200: _json("trace_settings")}
    ),
    ("POST", "/v2/trace/setting"): Operation(
        "set_trace_settings",
        "Change the global trace settings",
        "trace",
        {200: _json("trace_settings")},
        (400, 413),
        body="trace_settings",
        needs="admin",
    ),
    ("GET", _M + "/trace/setting"): _TRACE_GET,
    ("POST", _M + "/trace/setting"): _TRACE_POST,
    ("GET", "/v2/logging"): Operation(
        "log_settings", "The log settings", "logging", {200: _json("log_settings")}
    ),
    ("POST", "/v2/logging"): Operation(
        "set_log_settings",
        "Change the log settings",
        "logging",
        {200: _json("log_settings")},
        (400, 413),
        body="log_settings",
        needs="admin",
    ),
    ("GET", _M + "/drift"): _DRIFT,
    ("GET", _MV + "/drift"): _versioned(_DRIFT),
    ("POST", _M + "/drift/reference"): _DRIFT_REFERENCE,
    ("POST", _MV + "/drift/reference"): _versioned(_DRIFT_REFERENCE),
    ("GET", "/v2/openapi.json"): Operation(
        "openapi", "This document (OpenAPI 3.1)", "metadata", {200: {JSON: {"type": "object"}}}
    ),
    ("GET", "/docs"): Operation(
        "docs",
        "A page to try the API (Swagger UI)",
        "metadata",
        {200: {HTML: {"type": "string"}}},
    ),
    ("GET", "/docs/{asset}"): Operation(
        "docs_asset",
        "The page's scripts and styles",
        "metadata",
        {
            200: {
                "text/javascript": {"type": "string"},
                "text/css": {"type": "string"},
                "image/png": {"type": "string", "format": "binary"},
            }
        },
        (404,),
    ),
}
