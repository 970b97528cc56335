"""`DynamicBatcher`: merging, splitting, policies, failures and shutdown, with a fake instance.

Each test runs its own event loop with `asyncio.run`. An instance can be held inside `execute`
by a gate (a `threading.Event`), which is how requests are made to queue behind a busy one:
no test depends on how fast anything runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from inferd.backends.base import AnyInstance
from inferd.errors import ErrorKind, InferdError
from inferd.events import BatchRecord, RequestRecord, Telemetry
from inferd.scheduling.batcher import BatchClose, BatchingOptions, DynamicBatcher
from inferd.scheduling.isolate import RequestFailedAloneError
from inferd.scheduling.queues import QueuePolicy
from inferd.tensors.signature import BoundRequest
from inferd.types import Array
from tests.support.batcher_harness import Instance, options, outputs, req, run, until


async def queue_behind_busy(
    batcher: DynamicBatcher, instance: Instance, requests: list[BoundRequest]
) -> list[Any]:
    """Hold the instance on a blocker request, queue `requests`, then let everything run.

    Returns each request's outputs (or the exception it raised), in order.
    """
    assert instance.gate is not None
    blocker = asyncio.create_task(outputs(batcher, req(-1.0)))
    await until(instance.entered.is_set)
    tasks = [asyncio.create_task(outputs(batcher, r)) for r in requests]
    await until(lambda: batcher.inflight() == len(requests) + 1)
    instance.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await blocker
    return results


def rows_of(batch: Array) -> list[float]:
    return batch[:, 0].tolist()


class Batches:
    """A telemetry sink keeping each batch's record: what statistics and metrics read."""

    def __init__(self) -> None:
        self.records: list[BatchRecord] = []

    def on_request(self, record: RequestRecord) -> None:
        pass

    def on_batch(self, record: BatchRecord) -> None:
        self.records.append(record)


_batches: weakref.WeakKeyDictionary[DynamicBatcher, Batches] = weakref.WeakKeyDictionary()


def dynamic(name: str, instances: Sequence[Any], opts: BatchingOptions) -> DynamicBatcher:
    """A batcher whose batches `records` reads from its telemetry."""
    sink = Batches()
    typed: Sequence[AnyInstance] = instances
    batcher = DynamicBatcher(name, typed, opts, telemetry=Telemetry([sink]))
    _batches[batcher] = sink
    return batcher


def records(batcher: DynamicBatcher) -> list[tuple[int, int, BatchClose]]:
    """(rows, requests, why it closed) of each batch executed, in order."""
    return [(r.rows, r.requests, BatchClose(r.close_reason)) for r in _batches[batcher].records]


# -- work-conserving (the default) ------------------------------------------------------------


def test_lone_request_executes_alone_at_once() -> None:
    async def main() -> None:
        inst = Instance()
        # A long delay that must not be waited for: work_conserving never holds a request.
        batcher = dynamic("m", [inst], options(max_delay_s=3600))
        try:
            out = await outputs(batcher, req(1.5, 2.5))
            assert out["OUT"].tolist() == [[3.0], [5.0]]
            assert [rows_of(b) for b in inst.batches] == [[1.5, 2.5]]
            assert records(batcher) == [(2, 1, BatchClose.QUEUE_EMPTY)]
        finally:
            await batcher.stop()

    run(main)


def test_arrivals_while_busy_are_merged_into_the_next_batch() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(max_delay_s=3600))
        try:
            results = await queue_behind_busy(batcher, inst, [req(1), req(2), req(3)])
            assert [r["OUT"].tolist() for r in results] == [[[2.0]], [[4.0]], [[6.0]]]
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1.0, 2.0, 3.0]]
            assert records(batcher) == [
                (1, 1, BatchClose.QUEUE_EMPTY),
                (3, 3, BatchClose.QUEUE_EMPTY),
            ]
        finally:
            await batcher.stop()

    run(main)


def test_max_batch_size_is_respected() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(max_batch_size=4))
        try:
            results = await queue_behind_busy(batcher, inst, [req(v) for v in range(6)])
            assert [r["OUT"].tolist() for r in results] == [[[2.0 * v]] for v in range(6)]
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [0, 1, 2, 3], [4, 5]]
            assert records(batcher) == [
                (1, 1, BatchClose.QUEUE_EMPTY),
                (4, 4, BatchClose.FULL),
                (2, 2, BatchClose.QUEUE_EMPTY),
            ]
        finally:
            await batcher.stop()

    run(main)


def test_multi_row_request_that_would_overflow_waits_for_the_next_batch() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(max_batch_size=4))
        try:
            results = await queue_behind_busy(batcher, inst, [req(1, 2, 3), req(4, 5)])
            assert results[0]["OUT"].tolist() == [[2.0], [4.0], [6.0]]
            assert results[1]["OUT"].tolist() == [[8.0], [10.0]]
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1, 2, 3], [4, 5]]
            assert records(batcher)[1] == (3, 1, BatchClose.FULL)
            assert max(rows for rows, _, _ in records(batcher)) <= 4
        finally:
            await batcher.stop()

    run(main)


def test_preferred_size_is_taken_from_a_longer_queue() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(max_batch_size=8, preferred_sizes=(4,)))
        try:
            results = await queue_behind_busy(batcher, inst, [req(v) for v in range(6)])
            assert [r["OUT"].tolist() for r in results] == [[[2.0 * v]] for v in range(6)]
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [0, 1, 2, 3], [4, 5]]
            assert records(batcher) == [
                (1, 1, BatchClose.QUEUE_EMPTY),
                (4, 4, BatchClose.PREFERRED_SIZE),
                (2, 2, BatchClose.QUEUE_EMPTY),
            ]
        finally:
            await batcher.stop()

    run(main)


def test_largest_fillable_preferred_size_wins() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        opts = options(max_batch_size=8, preferred_sizes=(2, 4, 6))
        batcher = dynamic("m", [inst], opts)
        try:
            await queue_behind_busy(batcher, inst, [req(v) for v in range(5)])
            assert records(batcher)[1:] == [
                (4, 4, BatchClose.PREFERRED_SIZE),
                (1, 1, BatchClose.QUEUE_EMPTY),
            ]
        finally:
            await batcher.stop()

    run(main)


def test_shape_mismatch_splits_batches_in_queue_order() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options())
        try:
            requests = [req(1), req(2), req(3, width=2), req(4), req(5)]
            results = await queue_behind_busy(batcher, inst, requests)
            assert results[2]["OUT"].tolist() == [[6.0, 6.0]]
            assert [r["OUT"].tolist() for i, r in enumerate(results) if i != 2] == [
                [[2.0]],
                [[4.0]],
                [[8.0]],
                [[10.0]],
            ]
            assert [b.shape for b in inst.batches] == [(1, 1), (2, 1), (1, 2), (2, 1)]
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1, 2], [3], [4, 5]]
            assert records(batcher) == [
                (1, 1, BatchClose.QUEUE_EMPTY),
                (2, 2, BatchClose.SHAPE_MISMATCH),
                (1, 1, BatchClose.SHAPE_MISMATCH),
                (2, 2, BatchClose.QUEUE_EMPTY),
            ]
        finally:
            await batcher.stop()

    run(main)


def test_multi_row_requests_are_merged_and_split_back() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(max_batch_size=8))
        try:
            requests = [req(1, 2), req(3, 4, 5), req(6), req(7, 8)]
            results = await queue_behind_busy(batcher, inst, requests)
            for r, out in zip(requests, results, strict=True):
                assert out["OUT"].shape == (r.rows, 1)
                assert out["OUT"].tolist() == (r.inputs["IN"] * 2).tolist()
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1, 2, 3, 4, 5, 6, 7, 8]]
            assert records(batcher)[1] == (8, 4, BatchClose.FULL)
        finally:
            await batcher.stop()

    run(main)


# -- window and none policies -----------------------------------------------------------------


def test_window_waits_for_the_delay_when_nothing_else_comes() -> None:
    async def main() -> None:
        inst = Instance()
        batcher = dynamic("m", [inst], options(max_delay_s=0.02, policy="window"))
        try:
            out = await outputs(batcher, req(7))
            assert out["OUT"].tolist() == [[14.0]]
            assert records(batcher) == [(1, 1, BatchClose.MAX_DELAY)]
        finally:
            await batcher.stop()

    run(main)


def test_window_leaves_at_once_when_full() -> None:
    async def main() -> None:
        inst = Instance()
        # A delay the test would never survive: the batch must leave because it is full.
        batcher = dynamic("m", [inst], options(max_batch_size=4, max_delay_s=3600, policy="window"))
        try:
            results = await asyncio.gather(*(outputs(batcher, req(v)) for v in range(4)))
            assert [r["OUT"].tolist() for r in results] == [[[2.0 * v]] for v in range(4)]
            assert [rows_of(b) for b in inst.batches] == [[0, 1, 2, 3]]
            assert records(batcher) == [(4, 4, BatchClose.FULL)]
        finally:
            await batcher.stop()

    run(main)


def test_window_leaves_at_once_at_a_preferred_size() -> None:
    async def main() -> None:
        inst = Instance()
        opts = options(max_batch_size=8, preferred_sizes=(2,), max_delay_s=3600, policy="window")
        batcher = dynamic("m", [inst], opts)
        try:
            await asyncio.gather(outputs(batcher, req(1)), outputs(batcher, req(2)))
            assert records(batcher) == [(2, 2, BatchClose.PREFERRED_SIZE)]
        finally:
            await batcher.stop()

    run(main)


def test_policy_none_runs_each_request_alone() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(policy="none"))
        try:
            results = await queue_behind_busy(batcher, inst, [req(1), req(2, 3), req(4)])
            assert results[1]["OUT"].tolist() == [[4.0], [6.0]]
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1], [2, 3], [4]]
            assert [requests for _, requests, _ in records(batcher)] == [1, 1, 1, 1]
        finally:
            await batcher.stop()

    run(main)


def test_unbatched_model_runs_each_request_alone() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options(max_batch_size=0))
        try:
            await queue_behind_busy(batcher, inst, [req(1), req(2)])
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1], [2]]
        finally:
            await batcher.stop()

    run(main)


# -- failures ---------------------------------------------------------------------------------


def test_wrong_output_batch_size_fails_every_request_in_the_batch() -> None:
    async def main() -> None:
        def drop_rows(inputs: dict[str, Array]) -> dict[str, Array]:
            return {"OUT": inputs["IN"][:1] * 2}

        inst = Instance(gate=threading.Event(), run=drop_rows)
        batcher = dynamic("m", [inst], options())
        try:
            results = await queue_behind_busy(batcher, inst, [req(1), req(2), req(3)])
            for exc in results:
                assert isinstance(exc, InferdError)
                assert exc.kind is ErrorKind.MODEL_ERROR
                assert "model 'm'" in exc.message
                assert "output 'OUT'" in exc.message
                assert "3 rows" in exc.message
        finally:
            await batcher.stop()

    run(main)


def test_wrong_output_batch_size_fails_a_lone_request() -> None:
    async def main() -> None:
        inst = Instance(run=lambda inputs: {"OUT": inputs["IN"][:1]})
        batcher = dynamic("m", [inst], options())
        try:
            with pytest.raises(InferdError) as info:
                await outputs(batcher, req(1, 2))
            assert info.value.kind is ErrorKind.MODEL_ERROR
            assert "model 'm'" in info.value.message
            assert "output 'OUT'" in info.value.message
        finally:
            await batcher.stop()

    run(main)


def test_scalar_output_of_a_batching_model_is_a_model_error() -> None:
    async def main() -> None:
        inst = Instance(run=lambda _: {"OUT": np.float32(1.0)})  # type: ignore[dict-item]
        batcher = dynamic("m", [inst], options())
        try:
            with pytest.raises(InferdError) as info:
                await outputs(batcher, req(1))
            assert info.value.kind is ErrorKind.MODEL_ERROR
            assert "output 'OUT'" in info.value.message
        finally:
            await batcher.stop()

    run(main)


def test_unbatched_model_outputs_are_passed_through() -> None:
    async def main() -> None:
        inst = Instance(run=lambda _: {"OUT": np.float32(1.0)})  # type: ignore[dict-item]
        batcher = dynamic("m", [inst], options(max_batch_size=0))
        try:
            out = await outputs(batcher, req(1, 2))
            assert out["OUT"].tolist() == 1.0
        finally:
            await batcher.stop()

    run(main)


def test_exception_in_execute_is_a_model_error() -> None:
    async def main() -> None:
        def boom(inputs: dict[str, Array]) -> dict[str, Array]:
            raise RuntimeError("boom: kernel exploded")

        inst = Instance(run=boom)
        batcher = dynamic("m", [inst], options())
        try:
            with pytest.raises(InferdError) as info:
                await outputs(batcher, req(1))
            assert info.value.kind is ErrorKind.MODEL_ERROR
            assert "model 'm'" in info.value.message
            assert "boom: kernel exploded" in info.value.message
            # The instance is back in service afterwards.
            inst.run = None
            assert (await outputs(batcher, req(2)))["OUT"].tolist() == [[4.0]]
        finally:
            await batcher.stop()

    run(main)


def test_a_batch_failure_that_does_not_persist_fails_no_request() -> None:
    """A failed batch is executed again in halves (isolate.py): a failure none of its
    requests reproduces is nobody's, and every request gets its answer."""

    async def main() -> None:
        calls = 0

        def second_call_fails(inputs: dict[str, Array]) -> dict[str, Array]:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise ValueError("bad batch")
            return {"OUT": inputs["IN"] * 2}

        inst = Instance(gate=threading.Event(), run=second_call_fails)
        batcher = dynamic("m", [inst], options())
        try:
            results = await queue_behind_busy(batcher, inst, [req(1), req(2)])
            assert [r["OUT"].tolist() for r in results] == [[[2.0]], [[4.0]]]
            assert calls == 4  # the blocker, the failed pair, each half
            assert batcher.consecutive_failures == 0
        finally:
            await batcher.stop()

    run(main)


def test_only_the_requests_a_model_fails_on_alone_get_the_error() -> None:
    async def main() -> None:
        def negative_fails(inputs: dict[str, Array]) -> dict[str, Array]:
            if (inputs["IN"] < 0).any() and (inputs["IN"] != -1).all():
                raise ValueError("negative values are poison")
            return {"OUT": inputs["IN"] * 2}

        inst = Instance(gate=threading.Event(), run=negative_fails)
        batcher = dynamic("m", [inst], options())
        try:
            values = [1.0, -2.0, 3.0, 4.0, 5.0, -6.0, 7.0]
            results = await queue_behind_busy(batcher, inst, [req(v) for v in values])
            for v, r in zip(values, results, strict=True):
                if v < 0:
                    assert isinstance(r, RequestFailedAloneError)
                    assert r.kind is ErrorKind.MODEL_ERROR
                    assert "negative values are poison" in r.message
                else:
                    assert r["OUT"].tolist() == [[2 * v]]
            executed = len(inst.batches) - 2  # not the blocker, not the failed batch
            assert executed <= 2 * len(values) - 2
            assert batcher.consecutive_failures == 0  # the model serves: not its failure
        finally:
            await batcher.stop()

    run(main)


def test_a_batch_that_runs_out_of_memory_is_not_bisected() -> None:
    """Smaller parts would succeed and hide that the batch is too large for the instance."""

    async def main() -> None:
        def too_large(inputs: dict[str, Array]) -> dict[str, Array]:
            if len(inputs["IN"]) > 1:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return {"OUT": inputs["IN"] * 2}

        inst = Instance(gate=threading.Event(), run=too_large)
        batcher = dynamic("m", [inst], options())
        try:
            results = await queue_behind_busy(batcher, inst, [req(1), req(2), req(3)])
            assert all(isinstance(e, InferdError) and "out of memory" in e.message for e in results)
            assert len(inst.batches) == 2  # the blocker, the batch: no part executed again
        finally:
            await batcher.stop()

    run(main)


def test_a_batch_every_request_fails_alone_is_the_models_failure() -> None:
    async def main() -> None:
        def always(inputs: dict[str, Array]) -> dict[str, Array]:
            if (inputs["IN"] != -1).all():
                raise ValueError("broken")
            return {"OUT": inputs["IN"]}

        inst = Instance(gate=threading.Event(), run=always)
        batcher = dynamic("m", [inst], options())
        try:
            results = await queue_behind_busy(batcher, inst, [req(1), req(2), req(3)])
            assert all(
                isinstance(e, InferdError) and not isinstance(e, RequestFailedAloneError)
                for e in results
            )
            assert batcher.consecutive_failures == 1
        finally:
            await batcher.stop()

    run(main)


def test_cancelled_queued_request_is_never_executed() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options())
        try:
            blocker = asyncio.create_task(outputs(batcher, req(-1)))
            await until(inst.entered.is_set)
            first = asyncio.create_task(outputs(batcher, req(1)))
            doomed = asyncio.create_task(outputs(batcher, req(2)))
            last = asyncio.create_task(outputs(batcher, req(3)))
            await until(lambda: batcher.inflight() == 4)
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            inst.gate.set()  # type: ignore[union-attr]
            assert (await first)["OUT"].tolist() == [[2.0]]
            assert (await last)["OUT"].tolist() == [[6.0]]
            await blocker
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [1, 3]]
            assert records(batcher)[1] == (2, 2, BatchClose.QUEUE_EMPTY)
        finally:
            await batcher.stop()

    run(main)


def test_a_cancelled_request_leaves_the_queue_depth_and_its_limit_at_once() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        bounded = options(queue_policies=(QueuePolicy(max_queue_size=1),))
        batcher = dynamic("m", [inst], bounded)
        try:
            blocker = asyncio.create_task(outputs(batcher, req(-1)))
            await until(inst.entered.is_set)
            doomed = asyncio.create_task(outputs(batcher, req(1)))
            await until(lambda: batcher.queue_depth() == 1)
            assert batcher.refuses_all()
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            # Still in the FIFO until the batcher reaches it, but no longer waiting.
            assert (batcher.queue_depth(), batcher.inflight()) == (0, 1)
            assert not batcher.refuses_all()
            kept = asyncio.create_task(outputs(batcher, req(2)))
            await until(lambda: batcher.queue_depth() == 1)
            inst.gate.set()  # type: ignore[union-attr]
            assert (await kept)["OUT"].tolist() == [[4.0]]
            await blocker
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [2]]
        finally:
            await batcher.stop()

    run(main)


def test_cancelled_head_of_queue_is_skipped() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options())
        try:
            blocker = asyncio.create_task(outputs(batcher, req(-1)))
            await until(inst.entered.is_set)
            doomed = asyncio.create_task(outputs(batcher, req(1)))
            kept = asyncio.create_task(outputs(batcher, req(2)))
            await until(lambda: batcher.inflight() == 3)
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            inst.gate.set()  # type: ignore[union-attr]
            assert (await kept)["OUT"].tolist() == [[4.0]]
            await blocker
            assert [rows_of(b) for b in inst.batches] == [[-1.0], [2]]
        finally:
            await batcher.stop()

    run(main)


# -- lifecycle and instances ------------------------------------------------------------------


def test_stop_drains_the_queue_then_closes() -> None:
    async def main() -> None:
        log: list[str] = []
        inst = Instance(gate=threading.Event(), log=log)
        batcher = dynamic("m", [inst], options())
        blocker = asyncio.create_task(outputs(batcher, req(-1)))
        await until(inst.entered.is_set)
        queued = [asyncio.create_task(outputs(batcher, req(v))) for v in (1, 2, 3)]
        await until(lambda: batcher.inflight() == 4)
        stopping = asyncio.create_task(batcher.stop())
        await asyncio.sleep(0)
        with pytest.raises(InferdError) as info:
            await outputs(batcher, req(9))
        assert info.value.kind is ErrorKind.UNAVAILABLE
        assert not inst.closed
        inst.gate.set()  # type: ignore[union-attr]
        await stopping
        assert inst.closed
        assert log == ["execute", "execute", "close"]
        assert (await blocker)["OUT"].tolist() == [[-2.0]]
        assert [(await t)["OUT"].tolist() for t in queued] == [[[2.0]], [[4.0]], [[6.0]]]

    run(main)


def test_stop_closes_every_instance() -> None:
    async def main() -> None:
        instances = [Instance(), Instance(), Instance()]
        batcher = dynamic("m", instances, options())
        await outputs(batcher, req(1))
        await batcher.stop()
        assert all(inst.closed for inst in instances)

    run(main)


def test_instances_execute_batches_in_parallel() -> None:
    async def main() -> None:
        # Each execute waits at the barrier until the other one has arrived too: a batcher
        # that ran the instances one at a time would break it.
        barrier = threading.Barrier(2)
        a, b = Instance(barrier=barrier), Instance(barrier=barrier)
        batcher = dynamic("m", [a, b], options())
        try:
            first = asyncio.create_task(outputs(batcher, req(1)))
            await until(lambda: a.entered.is_set() or b.entered.is_set())
            second = asyncio.create_task(outputs(batcher, req(2)))
            assert (await first)["OUT"].tolist() == [[2.0]]
            assert (await second)["OUT"].tolist() == [[4.0]]
            assert not barrier.broken
            assert len(a.batches) == 1
            assert len(b.batches) == 1
            assert sorted(rows_of(x.batches[0]) for x in (a, b)) == [[1.0], [2.0]]
        finally:
            await batcher.stop()

    run(main)


def test_inflight_counts_queued_and_executing() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = dynamic("m", [inst], options())
        try:
            assert batcher.inflight() == 0
            await queue_behind_busy(batcher, inst, [req(1), req(2)])
            assert batcher.inflight() == 0
        finally:
            await batcher.stop()

    run(main)


def test_a_stale_estimate_lets_one_request_through_to_measure_the_model_again() -> None:
    """Deadline-aware admission refuses deadlines shorter than the model's typical execution;
    an estimate that refuses everything would never be measured again. Once the model has
    been idle past the estimate's age, the next such request runs, and its execution updates
    the estimate."""

    async def main() -> None:
        inst = Instance()
        batcher = dynamic("m", [inst], options())
        runner = batcher._runner
        try:
            await outputs(batcher, req(1.0))  # one execution: an estimate exists
            runner.exec_s = 1.0  # as if the model took a second per execution

            def soon() -> int:
                return time.perf_counter_ns() + 50_000_000  # a 50 ms deadline

            with pytest.raises(InferdError) as info:
                await batcher.submit(req(2.0), deadline_ns=soon())
            assert info.value.kind is ErrorKind.INVALID_ARGUMENT
            assert "typical execution time is about 1000.0 ms" in info.value.message
            runner.measured_at -= 100  # idle, the estimate a hundred seconds old
            out, _ = await batcher.submit(req(3.0), deadline_ns=soon())
            assert out["OUT"].tolist() == [[6.0]]  # measured: the model is fast again
            assert runner.exec_s is not None and runner.exec_s < 1.0
            assert [rows_of(b) for b in inst.batches] == [[1.0], [3.0]]
            # Fresh again: the next unmeetable deadline is refused as before, unexecuted.
            runner.exec_s = 1.0
            with pytest.raises(InferdError):
                await batcher.submit(req(4.0), deadline_ns=soon())
            assert len(inst.batches) == 2
        finally:
            await batcher.stop()

    run(main)
