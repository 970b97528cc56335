"""The protocol-neutral core that the HTTP and gRPC adapters both call.

Adapters translate their wire format into `InferRequest` and back; everything else (lookup,
checks, scheduling, output conformance) happens here, once. The DataPlane is made of parts,
each owning its state, built together in one phase from what the server passes:

    gate        requests in flight, the server-wide bound, draining      request_gate.py
    unary       start, admit, refusal, infer, respond                    unary.py
    streaming   start_stream, admit_stream, stream                       decoupled.py
    internal    ensembles' steps and BLS requests, through those steps   internal_requests.py
    health      live, ready, model_ready                                 health.py
    metadata    server and model metadata, configs, repository index     metadata.py
    statistics  Triton's statistics, of this process and of the server   statistics_api.py
    admin       load/unload, routing, drift references, shared memory,   admin.py
                feedback: apart from the request path
    runtime     the trace and log settings APIs      telemetry/runtime_settings.py

The request steps are bound onto the DataPlane itself (`plane.start`, `plane.infer`, ...):
the adapters' hot path calls them without a hop through the part.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.cache.response_cache import ResponseCache
from inferd.dataplane.access import AccessPolicy
from inferd.dataplane.admin import Admin
from inferd.dataplane.capture import Capture
from inferd.dataplane.decoupled import StreamingSteps
from inferd.dataplane.health import Health
from inferd.dataplane.internal_requests import InternalCalls
from inferd.dataplane.metadata import Metadata
from inferd.dataplane.request_gate import RequestGate
from inferd.dataplane.shm_regions import SharedMemoryRegistry
from inferd.dataplane.statistics_api import ProviderFactory, Statistics
from inferd.dataplane.unary import SignatureChecks, UnarySteps
from inferd.events import Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.telemetry.runtime_settings import RuntimeSettings
from inferd.telemetry.statistics import ProcessStatistics, StatisticsSink
from inferd.telemetry.trace_settings import TraceSettings
from inferd.tensors.wire_format import MAX_BYTES_ELEMENTS


@dataclass(frozen=True, slots=True)
class PlaneOptions:
    """The server's settings the DataPlane reads, once."""

    admin_api: bool = False  # the repository and routing APIs (admin.py)
    model_upload: str = "off"  # load's `file:` parameters: off, files or code
    max_inflight: int = 0  # --max-inflight-requests (0: none)
    max_response_bytes: int = 0  # --max-response-mib (0: none)
    max_copy_bytes: int = 64 * 2**20  # BYTES inputs in shared memory (--max-request-mib)
    max_bytes_elements: int = MAX_BYTES_ELEMENTS  # --max-bytes-elements
    processes: int = 1  # the server processes of --workers N that serve the repository


class DataPlane:
    """Inference and every other API, protocol-neutral (the module's docstring lists the
    parts). `capture`, `response_cache`, `checked_signatures`, `trace` and `statistics` are
    the server's: --capture-dir's capture, --cache-config's cache, --engine's model table,
    the trace settings, and where the whole server's statistics come from."""

    def __init__(
        self,
        registry: ModelRegistry,
        telemetry: Telemetry,
        options: PlaneOptions | None = None,
        *,
        access: AccessPolicy | None = None,
        capture: Capture | None = None,
        response_cache: ResponseCache | None = None,
        checked_signatures: SignatureChecks | None = None,
        trace: TraceSettings | None = None,
        statistics: ProviderFactory = ProcessStatistics,
    ) -> None:
        options = options or PlaneOptions()
        self.registry = registry
        self.telemetry = telemetry
        # Who may call which API group: the adapters consult it with each call's headers.
        self.access = access or AccessPolicy()
        self.capture = capture or Capture(registry)
        self.response_cache = response_cache
        self.shared_memory = SharedMemoryRegistry(
            max_copy_bytes=options.max_copy_bytes,
            max_bytes_elements=options.max_bytes_elements,
        )
        self.gate = RequestGate(telemetry, options.max_inflight)
        # Internal calls go through the steps below (bound onto this object at the end).
        self.internal = InternalCalls(self)
        self.unary = UnarySteps(
            registry,
            self.gate,
            self.shared_memory,
            self.capture,
            self.internal,
            response_cache,
            checked_signatures,
            options.max_response_bytes,
        )
        self.streaming = StreamingSteps(registry, self.unary)
        self.health = Health(registry, self.gate)
        self.metadata = Metadata(registry, options.processes)
        sink = StatisticsSink()
        telemetry.add(sink)
        self.statistics = Statistics(registry, sink, statistics)
        telemetry.keeps(self.statistics)
        self.admin = Admin(
            registry,
            self.shared_memory,
            self.capture,
            options.admin_api,
            options.model_upload,
            options.processes,
        )
        # The trace and log settings APIs, changed through the same gate as the repository.
        self.runtime = RuntimeSettings(
            self.admin.require,
            lambda name: name in self.registry.models,
            trace,
            options.processes,
        )
        # The request steps, bound here: what the adapters (dataplane/unary_plane.py) and
        # internal calls (`ModelCalls`) call.
        self.start = self.unary.start
        self.admit = self.unary.admit
        self.refusal = self.unary.refusal
        self.infer = self.unary.infer
        self.respond = self.unary.respond
        self.start_stream = self.streaming.start_stream
        self.admit_stream = self.streaming.admit_stream
        self.stream = self.streaming.stream

    @property
    def is_shutting_down(self) -> bool:
        return self.gate.is_shutting_down

    @is_shutting_down.setter
    def is_shutting_down(self, value: bool) -> None:
        """Set once a shutdown begins: not ready, and nothing more admitted."""
        self.gate.is_shutting_down = value
