"""Readiness's probe (scheduling/readiness_probe.py) on a real `DynamicBatcher` with a fake
instance: a run of failed executions is the model's only when the probe fails too.

The instance doubles its input and raises on negative values (one client's bad input), or
on everything while `broken` is set (the model failing). Probes are told apart from requests
by what the instance executed.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inferd.errors import InferdError
from inferd.scheduling import readiness_probe
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.pending import Pending
from inferd.scheduling.readiness_probe import KEEP_MAX_BYTES, PROBE_ID, ReadinessProbe
from inferd.tensors.signature import BoundRequest
from inferd.types import Array
from tests.support.batcher_harness import Instance, options, outputs, req, run

AFTER = 3


class Model:
    """What the instance runs: the requests' ids and values it saw, in order."""

    def __init__(self) -> None:
        self.broken = False
        self.seen: list[list[float]] = []

    def __call__(self, inputs: dict[str, Array]) -> dict[str, Array]:
        x = inputs["IN"]
        self.seen.append(x[:, 0].tolist())
        if self.broken:
            raise RuntimeError("the model is broken")
        if (x < 0).any():
            raise ValueError("negative values are rejected")
        return {"OUT": x * 2}


def batcher(model: Model, sample: BoundRequest | None = None) -> DynamicBatcher:
    return DynamicBatcher(
        "m", [Instance(run=model)], options(), unready_after_failures=AFTER, probe_sample=sample
    )


async def fail(b: DynamicBatcher, value: float, times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(InferdError):
            await outputs(b, req(value))


@pytest.fixture(autouse=True)
def one_probe_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """No second probe within a test unless it asks (the real spacing is a second)."""
    monkeypatch.setattr(readiness_probe, "PROBE_EVERY_S", 3600.0)


def test_one_clients_bad_inputs_fail_a_run_but_the_sample_passes() -> None:
    async def main() -> None:
        model = Model()
        b = batcher(model, sample=req(0.0))
        try:
            await fail(b, -1.0, AFTER - 1)
            assert b.readiness_problem() == "" and b.readiness.passed == 0
            await fail(b, -1.0)  # the third: the probe runs before it is answered
            assert model.seen[-1] == [0.0]  # the sample
            assert b.readiness.passed == 1 and b.readiness.failed == 0
            assert b.consecutive_failures == 0  # the failures were the inputs'
            await fail(b, -1.0, 1000)  # a client sending garbage in a loop: never unready
            assert b.readiness_problem() == ""
            assert (await outputs(b, req(2.0)))["OUT"].tolist() == [[4.0]]
        finally:
            await b.stop()

    run(main)


def test_a_model_failing_everything_fails_its_probe_and_is_unready_until_a_success() -> None:
    async def main() -> None:
        model = Model()
        b = batcher(model, sample=req(0.0))
        try:
            model.broken = True
            await fail(b, 1.0, AFTER)
            assert b.readiness.failed == 1
            problem = b.readiness_problem()
            assert "its last 3 executions failed, and so did its warm-up sample" in problem
            assert "the model is broken" in problem
            await fail(b, 1.0, 5)  # within the spacing: no probe, still unready
            assert b.readiness.failed == 1 and b.readiness_problem()
            model.broken = False
            assert (await outputs(b, req(1.0)))["OUT"].tolist() == [[2.0]]
            assert b.readiness_problem() == ""
        finally:
            await b.stop()

    run(main)


def test_the_probe_reruns_a_copy_of_a_request_that_succeeded() -> None:
    """So a model that fails every input it served, but still takes its warm-up sample,
    fails its probe."""

    async def main() -> None:
        model = Model()
        b = batcher(model, sample=req(0.0))
        try:
            served = req(7.0)
            served.parameters["p"] = 1
            await outputs(b, served)
            served.inputs["IN"][0, 0] = -9.0  # a client's buffer, reused after its answer
            kept = b.readiness.request
            assert kept is not None and kept is not served
            assert kept.request_id == PROBE_ID and kept.ctx is None
            assert kept.parameters == {"p": 1}
            model.broken = True
            await fail(b, 1.0, AFTER)
            assert model.seen[-1] == [7.0]  # the copy, not the reused buffer
            assert "and so did a request it served" in b.readiness_problem()
        finally:
            await b.stop()

    run(main)


def test_a_large_request_is_not_kept() -> None:
    async def main() -> None:
        model = Model()
        sample = req(0.0)
        b = batcher(model, sample=sample)
        try:
            width = KEEP_MAX_BYTES // 4 + 1  # FP32: one element past the bound
            await outputs(b, req(1.0, width=width))
            assert b.readiness.request is sample
        finally:
            await b.stop()

    run(main)


def test_nothing_to_probe_with_keeps_the_plain_count() -> None:
    """No warm-up sample and no success yet (auto_warmup off, or refused)."""

    async def main() -> None:
        model = Model()
        b = batcher(model)
        try:
            await fail(b, -1.0, AFTER - 1)
            assert b.readiness_problem() == ""
            await fail(b, -1.0)
            assert b.readiness_problem() == "its last 3 executions failed"
            assert b.readiness.passed == b.readiness.failed == 0
            await outputs(b, req(1.0))
            assert b.readiness_problem() == ""
            assert b.readiness.request is not None  # kept: it probes from now on
        finally:
            await b.stop()

    run(main)


def test_probes_are_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        model = Model()
        b = batcher(model, sample=req(0.0))
        try:
            await fail(b, -1.0, 4 * AFTER)
            assert b.readiness.passed == 1
            monkeypatch.setattr(readiness_probe, "PROBE_EVERY_S", 0.0)
            await fail(b, -1.0, 4 * AFTER)
            assert b.readiness.passed == 1 + 4  # one a run, with no spacing
        finally:
            await b.stop()

    run(main)


@pytest.mark.parametrize(
    ("after", "streak", "failure", "has_request", "problem"),
    [
        (0, 100, "", False, ""),  # unready_after_failures 0: never
        (0, 100, "boom", True, ""),
        (5, 4, "", False, ""),
        (5, 5, "", False, "its last 5 executions failed"),
        (5, 9, "", True, ""),  # a probe passed (or is spaced): the count alone says nothing
        (5, 1, "boom", True, "its last execution failed, and so did its warm-up sample"),
    ],
)
def test_problem(after: int, streak: int, failure: str, has_request: bool, problem: str) -> None:
    probe = ReadinessProbe(after, req(0.0) if has_request else None)
    probe.streak, probe.failure = streak, failure
    assert probe.problem().startswith(problem) and bool(probe.problem()) == bool(problem)


def test_what_keeps_requests() -> None:
    assert ReadinessProbe(5).keep_after == float("inf")  # a sequence model's
    assert ReadinessProbe(0, keeps=True).keep_after == float("inf")  # never unready
    assert ReadinessProbe(5, keeps=True).keep_after == 0.0


def test_every_input_is_copied() -> None:
    async def main() -> None:
        probe = ReadinessProbe(5, keeps=True)
        text = np.array([[b"abc"]], dtype=object)
        served = BoundRequest({"t": text}, 1, ((1,),), ["o"])
        pending = Pending(served, asyncio.get_running_loop().create_future())
        probe.keep([pending], [{}], now=0.0)
        assert probe.request is not None
        assert probe.request.inputs["t"] is not text
        assert probe.request.inputs["t"].tolist() == [[b"abc"]]
        assert probe.keep_after == readiness_probe.KEEP_EVERY_S

    run(main)
