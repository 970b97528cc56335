"""Readiness's verdict on failed executions: the model's failure, or its inputs'.

A model that fails every request must turn not ready (DESIGN.md, lesson 2); one client that
sends what the model rejects must not make it so (lesson 19). Counting failed executions
cannot tell them apart: five requests of invalid UTF-8 in a row, each executed alone, made a
Python model that decodes text unready while valid requests succeeded (issue 34). An input
the model is known to take can. So when `unready_after_failures` executions have failed in a
row, the instance that failed last executes a **probe** before that execution's requests are
answered: a copy of a recent request that succeeded (kept at most once a minute, up to 1 MiB
of inputs) or, until one has, the warm-up sample the model took at load.

- The probe succeeds: the model serves what it served before, and the failures were its
  inputs'. The count starts again and the model stays ready.
- It fails: the model fails what it served before. Not ready until an execution succeeds.
- At most one probe a second: within a second of a probe that passed, failures are counted
  but neither probe again nor make the model unready.
- Nothing to probe with (a decoupled or sequence model, or one that has answered no request
  yet and took no warm-up sample: `auto_warmup` off, or refused): the plain count decides,
  as before.

The probe runs as an execution of no request: it is not in the statistics or the execution
metrics; `inferd_readiness_probes_total{result}` counts it. Executions that pass the execution
timeout are counted but never probe (the instance is stuck or being replaced: the execution
timeout's rules say whether the model can serve).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import numpy as np

from inferd.backends.base import AnyInstance
from inferd.config.ragged_config import RaggedPlan
from inferd.scheduling.pending import Pending, Result
from inferd.scheduling.run_batch import run_batch
from inferd.tensors.signature import BoundRequest

PROBE_EVERY_S = 1.0  # at most one probe a second
KEEP_EVERY_S = 60.0  # a request that succeeded is kept at most this often
KEEP_MAX_BYTES = 1 << 20  # a larger request is not kept: it is copied on the event loop
PROBE_ID = "readiness-probe"  # the request id a model sees on a probe


class ReadinessProbe:
    """One version's failed executions in a row, and what its probes said (on the loop)."""

    __slots__ = (
        "after",
        "failed",
        "failure",
        "keep_after",
        "kept",
        "passed",
        "probed_at",
        "request",
        "streak",
    )

    def __init__(
        self, after: int = 0, sample: BoundRequest | None = None, keeps: bool = False
    ) -> None:
        """`after`: unready_after_failures (0: failures never make the model unready);
        `sample`: the warm-up sample the model took (None: none); `keeps`: whether requests
        that succeed may be kept to probe with (not a sequence model's)."""
        self.after = after
        self.streak = 0  # executions in a row that failed, since a success or a probe passed
        self.request = sample  # what the next probe executes; None: nothing
        self.kept = False  # `request` is a copy of a request that succeeded, not the sample
        # Monotonic time from which a success keeps its request (the runner compares it on
        # every success: inf when nothing is kept).
        self.keep_after = 0.0 if after and keeps else math.inf
        self.probed_at = -math.inf
        self.failure = ""  # why the last probe failed; "" once an execution succeeds
        self.passed = 0
        self.failed = 0

    def failed_execution(self, probes: bool, now: float) -> Pending | None:
        """Count a failed execution; the probe to execute now, before its requests are
        answered, or None. `probes`: the instance can execute one now."""
        self.streak += 1
        if (
            not probes
            or not self.after
            or self.request is None
            or self.streak < self.after
            or now - self.probed_at < PROBE_EVERY_S
        ):
            return None
        self.probed_at = now
        return Pending(self.request, asyncio.get_running_loop().create_future())

    def probed(self, error: str) -> None:
        """The probe's verdict: "" (it succeeded) or why it failed."""
        if not error:
            self.passed += 1
            self.streak = 0
            self.failure = ""
            return
        self.failed += 1
        if self.streak:  # (an execution that succeeded meanwhile has the last word)
            self.failure = error

    def what(self) -> str:
        """What a probe executes, for messages."""
        return "a request it served" if self.kept else "its warm-up sample"

    def last(self) -> str:
        """The run of failed executions, for messages."""
        return "its last execution" if self.streak == 1 else f"its last {self.streak} executions"

    def problem(self) -> str:
        """Why readiness must say the model fails, or ""."""
        if not self.after:
            return ""
        if self.failure:
            return (
                f"{self.last()} failed, and so did {self.what()} when executed again to check "
                f"it: {self.failure}"
            )
        if self.request is None and self.streak >= self.after:
            return f"{self.last()} failed"
        return ""

    def keep(self, batch: Sequence[Pending], results: Sequence[Result], now: float) -> None:
        """Keep a copy of a request of `batch` that succeeded to probe with: the first one
        whose inputs are small; a decoupled request's stream cannot be executed again."""
        self.keep_after = now + KEEP_EVERY_S
        for p, out in zip(batch, results, strict=True):
            request = p.request
            if p.filler or isinstance(out, Exception) or request.responses is not None:
                continue
            if sum(array.nbytes for array in request.inputs.values()) > KEEP_MAX_BYTES:
                continue
            # Copied: its inputs may be views of memory the client or the model reuses.
            self.request = BoundRequest(
                {name: np.array(array, copy=True) for name, array in request.inputs.items()},
                request.rows,
                request.shape_key,
                list(request.output_names),
                PROBE_ID,
                parameters=dict(request.parameters),
            )
            self.kept = True
            return


def run_probe(
    instance: AnyInstance,
    probe: Pending,
    batched: bool,
    by_request: bool,
    with_info: bool,
    ragged: RaggedPlan,
) -> None:
    """Execute the probe as a batch of its own, in the instance's thread; raises if the
    model fails it."""
    (result,), _ = run_batch(instance, [probe], batched, by_request, with_info, ragged)
    if isinstance(result, Exception):  # a model answering each request failed this one
        raise result
