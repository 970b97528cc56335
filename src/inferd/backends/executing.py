"""Which requests the execution running on this thread is for: the scheduler sets it around
each execution (scheduling/run_batch.py), and a backend's code may read it: a Python model's
calls to other models (BLS, backends/python/bls_request.py) act for those requests, with
their deadlines and trace context. Read only when a call is made, so an execution that
makes none pays one set and one reset."""

from __future__ import annotations

import contextvars
from collections.abc import Sequence

# The scheduler's pending requests of the batch (scheduling.pending.Pending), or the callers
# a thread relaying a worker process's calls acts for (bls_request.Caller).
EXECUTING: contextvars.ContextVar[Sequence[object]] = contextvars.ContextVar(
    "inferd_executing", default=()
)
