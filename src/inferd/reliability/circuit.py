"""Per-model circuit breaker: stop sending traffic to a model that keeps failing.

Configured by model config parameters (all optional; the breaker is off without them):

    circuit_breaker_failures      open after this many model errors in a row
    circuit_breaker_error_rate    ...or when this share of the window's requests failed
    circuit_breaker_window_s      the error-rate window (default 30)
    circuit_breaker_min_requests  requests needed in the window before the rate counts (20)
    circuit_breaker_open_s        how long it stays open before a probe (default 10)
    fallback_model                where requests go while it is open (else 503)

Open: requests fail fast with UNAVAILABLE or go to the fallback, and the model reports not
ready. After `open_s` one probe request is let through (half-open): success closes the
circuit, failure opens it again. Only model errors count, not bad requests.

A degradation tier with `open_circuit` (docs/reliability.md#degradation-tiers) holds it open
too, for as long as the model is in that tier, whatever its errors: `hold_open` and
`release_hold`. The tier's own probes measure the model meanwhile (`allow(probe=True)`).
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field

from inferd.reliability.sliding_window import SlidingWindow

log = logging.getLogger("inferd.circuit")

OUTCOMES_KEPT = 10_000  # past it the window holds the latest requests


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class CircuitPolicy:
    failures: int = 0  # 0: no consecutive-failure trigger
    error_rate: float = 0.0  # 0: no error-rate trigger
    window_s: float = 30.0
    min_requests: int = 20
    open_s: float = 10.0
    fallback_model: str = ""

    @property
    def enabled(self) -> bool:
        return self.failures > 0 or self.error_rate > 0


@dataclass(eq=False)
class CircuitBreaker:
    model: str
    policy: CircuitPolicy = field(default_factory=CircuitPolicy)
    state: CircuitState = CircuitState.CLOSED
    opened_at: float = 0.0
    consecutive_failures: int = 0
    opens: int = 0  # times it opened, for metrics
    held: str = ""  # why a degradation tier holds it open ("": not held)
    _probing: bool = False
    _outcomes: SlidingWindow = field(default_factory=lambda: SlidingWindow(OUTCOMES_KEPT))

    @property
    def is_open(self) -> bool:
        """Open, half-open or held open: the model is not (yet again) trusted to serve."""
        return bool(self.held) or self.state is not CircuitState.CLOSED

    def allow(self, probe: bool = False) -> bool:
        """May a request go to the model now? (Half-open lets exactly one probe through; a
        degradation tier's `probe` passes its hold, not the breaker's own state.)"""
        if self.held and not probe:
            return False
        if self.state is CircuitState.CLOSED or not self.policy.enabled:
            return True
        if self.state is CircuitState.OPEN:
            if time.monotonic() - self.opened_at < self.policy.open_s:
                return False
            self.state = CircuitState.HALF_OPEN
            self._probing = False
        if self._probing:
            return False
        self._probing = True
        return True

    def retry_in_s(self) -> float:
        return max(0.0, self.policy.open_s - (time.monotonic() - self.opened_at))

    def record(self, success: bool, counts: bool = True) -> None:
        """The outcome of a request the breaker allowed; `counts` is False for failures
        that are the request's fault (bad input), which never open the circuit."""
        if not self.policy.enabled:
            return
        if self.state is CircuitState.HALF_OPEN:
            if not counts:
                self._probing = False  # not a verdict on the model: probe again
                return
            if success:
                log.warning("model %s: probe succeeded, circuit closed", self.model)
                self._reset()
            else:
                self._open("the half-open probe failed")
            return
        now = time.monotonic()
        if not counts:
            return
        self._outcomes.record(0.0, success, now)  # only the error rate is read
        if success:
            self.consecutive_failures = 0
            return
        self.consecutive_failures += 1
        p = self.policy
        if p.failures and self.consecutive_failures >= p.failures:
            self._open(f"{self.consecutive_failures} failures in a row")
            return
        if p.error_rate:
            window = self._outcomes.summary(p.window_s, now)
            n, rate = window.requests, window.error_rate
            if n >= p.min_requests and rate > p.error_rate:
                self._open(f"error rate {rate:.0%} over {n} requests in {p.window_s:g} s")

    def hold_open(self, why: str) -> None:
        """A degradation tier opens it until `release_hold` (counted as an opening)."""
        self.held = why
        self.opens += 1
        log.warning(
            "model %s: circuit held open (%s); %s",
            self.model,
            why,
            f"requests go to '{self.policy.fallback_model}'"
            if self.policy.fallback_model
            else "requests fail fast",
            extra={"model": self.model, "event": "circuit_open"},
        )

    def release_hold(self) -> None:
        if self.held:
            self.held = ""
            log.warning(
                "model %s: circuit no longer held open (the degradation tier was left)",
                self.model,
                extra={"model": self.model, "event": "circuit_released"},
            )

    def _open(self, why: str) -> None:
        self.state = CircuitState.OPEN
        self.opened_at = time.monotonic()
        self.opens += 1
        self._probing = False
        log.warning(
            "model %s: circuit opened (%s); %s for %.0f s",
            self.model,
            why,
            f"requests go to '{self.policy.fallback_model}'"
            if self.policy.fallback_model
            else "requests fail fast",
            self.policy.open_s,
            extra={"model": self.model, "event": "circuit_open"},
        )

    def _reset(self) -> None:
        self.state = CircuitState.CLOSED
        self.consecutive_failures = 0
        self._probing = False
        self._outcomes.clear()
