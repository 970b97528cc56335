"""The Redis tier's breaker: after `failures` failed calls in a row it opens and Redis is
not tried for `open_s`; then one probe goes through (half-open): success closes it, failure
opens it again. So an outage costs a few bounded calls, not timeout_ms on every request."""

from __future__ import annotations

import time
from collections.abc import Callable

FAILURES = 3
OPEN_S = 5.0


class Breaker:
    def __init__(
        self,
        failures: int = FAILURES,
        open_s: float = OPEN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.open_s = open_s
        self.clock = clock
        self.consecutive = 0
        self.opened_at: float | None = None  # None: closed
        self.probing = False
        self.opens = 0  # times it opened

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def allow(self) -> bool:
        """Whether to try Redis now; when open, True once per open_s (the probe)."""
        if self.opened_at is None:
            return True
        if self.probing or self.clock() - self.opened_at < self.open_s:
            return False
        self.probing = True
        return True

    def succeeded(self) -> None:
        self.consecutive = 0
        self.opened_at = None
        self.probing = False

    def failed(self) -> None:
        self.consecutive += 1
        if self.probing or (self.opened_at is None and self.consecutive >= self.failures):
            self.opened_at = self.clock()
            self.opens += 1
        self.probing = False

    def abandoned(self) -> None:
        """The call ended without an outcome (cancelled): let the next one probe."""
        self.probing = False
