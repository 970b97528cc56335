"""A breaker of the Redis tier: after `failures` failed calls in a row it opens and Redis is
not tried for `open_s`; then one probe goes through (half-open): success closes it, failure
opens it again. So an outage costs a few bounded calls, not a timeout on every request.

"In a row" means one after the other: a failed call counts only if it began after the last
counted failure. Calls in flight together fail together when this process stalls (a busy
host does not run it for a while, and every pending call's deadline passes at once): that
is one failure, not three, and not an outage of Redis. A Redis that stopped answering fails
the calls sent after each failure too, and opens the breaker after `failures` of them.

The tier has one per operation, lookups and inserts (redis_tier.py): each opens on its own
calls' failures only, so slow background inserts never make lookups skip, nor the reverse."""

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
        self.failed_at: float | None = None  # when the last counted failure ended

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

    def refusing(self) -> bool:
        """Whether allow() would say no now (open, no probe due or one in flight); a
        question only: it takes no probe."""
        if self.opened_at is None:
            return False
        return self.probing or self.clock() - self.opened_at < self.open_s

    def succeeded(self) -> None:
        self.consecutive = 0
        self.opened_at = None
        self.probing = False

    def failed(self, started: float | None = None) -> None:
        """A call failed; `started` (this clock): when it began, None: just now. A call
        that began before the last counted failure ended is not counted again."""
        if started is not None and self.failed_at is not None and started < self.failed_at:
            return  # (a probe began after the failure that opened the breaker: it counts)
        self.failed_at = self.clock()
        self.consecutive += 1
        if self.probing or (self.opened_at is None and self.consecutive >= self.failures):
            self.opened_at = self.clock()
            self.opens += 1
        self.probing = False

    def abandoned(self) -> None:
        """The call ended without an outcome (cancelled): let the next one probe."""
        self.probing = False
