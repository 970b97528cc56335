"""What every request passes first, and what its end tells: the count of requests in
flight, the server-wide bound on them (`--max-inflight-requests`), and draining."""

from __future__ import annotations

from inferd.events import Telemetry


class RequestGate:
    """Owned by the DataPlane; each `InferCall` counts itself here while in flight and tells
    `telemetry` how it went at its end (unary_request.py); `UnarySteps.admit_version` refuses
    what the server cannot take now (draining: 503; too many in flight: 429)."""

    __slots__ = ("inflight", "is_shutting_down", "max_inflight", "telemetry")

    def __init__(self, telemetry: Telemetry, max_inflight: int = 0) -> None:
        self.telemetry = telemetry
        self.max_inflight = max_inflight  # server-wide limit of requests in flight (0: none)
        self.inflight = 0
        self.is_shutting_down = False  # set once a shutdown begins: not ready, nothing admitted
