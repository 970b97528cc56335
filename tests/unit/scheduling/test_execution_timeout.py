"""The execution timeout (`BatchRunner`): a stuck execution's requests fail at the timeout,
its instance leaves the pool until the call returns (or its worker process is replaced), and
nothing waits behind an instance that may never come back. Fake instances held by gates
(`threading.Event`); the end-to-end cases are in
tests/integration/scheduling/test_execution_timeout.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import ReplaceableInstance
from inferd.errors import ErrorKind, InferdError
from inferd.events import BatchRecord, RequestRecord, Telemetry
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.instance_runs import running_executions
from inferd.scheduling.sequence.sequence_batcher import SequenceBatcher
from inferd.scheduling.sequence.sequence_config import read_sequence_options
from inferd.tensors.signature import BoundRequest
from inferd.types import SEQUENCE_START, Array
from tests.support.batcher_harness import Instance, options, outputs, req, run, until

# Long enough that an instant fake execution never reaches it on a loaded machine.
TIMEOUT_S = 0.5


class Batches:
    """A telemetry sink keeping the batch records."""

    def __init__(self) -> None:
        self.records: list[BatchRecord] = []

    def on_request(self, record: RequestRecord) -> None:
        pass

    def on_batch(self, record: BatchRecord) -> None:
        self.records.append(record)


async def failure(batcher: DynamicBatcher | SequenceBatcher, request: BoundRequest) -> InferdError:
    with pytest.raises(InferdError) as info:
        await batcher.submit(request)
    return info.value


def test_a_stuck_execution_fails_at_the_timeout_and_its_instance_rejoins_when_it_returns() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        sink = Batches()
        batcher = DynamicBatcher(
            "m", [inst], options(), "1", Telemetry([sink]), execution_timeout_s=TIMEOUT_S
        )
        blocker = asyncio.create_task(failure(batcher, req(-1)))
        await until(inst.entered.is_set)
        queued = asyncio.create_task(failure(batcher, req(1)))
        await until(lambda: batcher.queue_depth() == 1)
        timed_out = await blocker
        assert timed_out.kind is ErrorKind.DEADLINE_EXCEEDED
        assert "model 'm' version 1" in timed_out.message
        assert "execution timeout of 500 ms (execution_timeout_ms)" in timed_out.message
        # The only instance is stuck: what queued behind it, and what comes now, is refused.
        refused = await queued
        assert refused.kind is ErrorKind.UNAVAILABLE
        assert "every instance is stuck" in refused.message
        assert (await failure(batcher, req(2))).kind is ErrorKind.UNAVAILABLE
        assert batcher.serving_instances() == 0
        assert batcher.unhealthy_instances() == 1
        assert [r.timed_out for r in sink.records] == [True]
        assert any("model 'm' version 1 instance 0" in r for r in running_executions())
        inst.gate.set()  # type: ignore[union-attr]  # the call returns: the instance serves again
        await until(lambda: batcher.serving_instances() == 1)
        assert batcher.unhealthy_instances() == 0
        assert (await outputs(batcher, req(3)))["OUT"].tolist() == [[6.0]]
        assert [r.timed_out for r in sink.records] == [True, False]
        assert rows_executed(inst) == [[-1.0], [3.0]]  # the refused ones never ran
        await batcher.stop()
        assert inst.closed

    run(main)


def rows_executed(inst: Instance) -> list[list[float]]:
    return [batch[:, 0].tolist() for batch in inst.batches]


def test_with_two_instances_the_healthy_one_keeps_serving() -> None:
    async def main() -> None:
        stuck, healthy = Instance(gate=threading.Event()), Instance()
        batcher = DynamicBatcher(
            "m", [stuck, healthy], options(), "1", execution_timeout_s=TIMEOUT_S
        )
        # The first idle instance takes the first batch.
        assert (await failure(batcher, req(-1))).kind is ErrorKind.DEADLINE_EXCEEDED
        assert batcher.serving_instances() == 1
        assert batcher.unhealthy_instances() == 1
        for value in (1, 2, 3):
            assert (await outputs(batcher, req(value)))["OUT"].tolist() == [[2.0 * value]]
        assert rows_executed(healthy) == [[1.0], [2.0], [3.0]]
        assert rows_executed(stuck) == [[-1.0]]
        stuck.gate.set()  # type: ignore[union-attr]
        await until(lambda: batcher.serving_instances() == 2)
        await batcher.stop()

    run(main)


class WorkerInstance(Instance):
    """A fake process-isolated instance: `kill_process` ends the stuck call, as killing the
    worker process does; `restarted` (when given) holds an execution before it reaches a
    worker, as a restart in progress does."""

    def __init__(self, restarted: threading.Event | None = None) -> None:
        super().__init__(gate=threading.Event())
        self.restarted = restarted
        self.kills: list[str] = []
        self.started_reads = 0
        self._started: float | None = None

    @property
    def execution_started(self) -> float | None:
        self.started_reads += 1
        return self._started

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        if self.restarted is not None:
            assert self.restarted.wait(10), "the test never finished the restart"
        self._started = time.monotonic()
        try:
            if (inputs["IN"] < 0).any():
                return super().execute(inputs)
            return {"OUT": inputs["IN"] * 2}
        finally:
            self._started = None

    def kill_process(self, reason: str) -> None:
        self.kills.append(reason)
        assert self.gate is not None
        self.gate.set()


def test_a_process_isolated_instance_is_replaced_not_taken_out_of_service() -> None:
    async def main() -> None:
        inst = WorkerInstance()
        assert isinstance(inst, ReplaceableInstance)
        batcher = DynamicBatcher("m", [inst], options(), "1", execution_timeout_s=TIMEOUT_S)
        error = await failure(batcher, req(-1))
        assert error.kind is ErrorKind.DEADLINE_EXCEEDED
        assert "its worker process is being replaced" in error.message
        assert inst.kills == ["an execution passed the timeout of 500 ms"]
        assert batcher.serving_instances() == 1  # being replaced: requests wait for it
        assert (await outputs(batcher, req(4)))["OUT"].tolist() == [[8.0]]
        await batcher.stop()

    run(main)


def test_waiting_for_a_worker_restart_is_not_execution_time() -> None:
    async def main() -> None:
        restarted = threading.Event()
        inst = WorkerInstance(restarted)
        batcher = DynamicBatcher("m", [inst], options(), "1", execution_timeout_s=0.05)
        answer = asyncio.create_task(outputs(batcher, req(5)))
        # The timeout passed twice while the call waited for its worker: it was not failed.
        await until(lambda: inst.started_reads >= 2)
        assert not answer.done()
        restarted.set()
        assert (await answer)["OUT"].tolist() == [[10.0]]
        assert inst.kills == []
        await batcher.stop()

    run(main)


def test_unloading_does_not_wait_for_a_stuck_instance_and_closes_it_when_it_returns() -> None:
    async def main() -> None:
        inst = Instance(gate=threading.Event())
        batcher = DynamicBatcher("m", [inst], options(), "1", execution_timeout_s=TIMEOUT_S)
        assert (await failure(batcher, req(-1))).kind is ErrorKind.DEADLINE_EXCEEDED
        await batcher.stop()
        assert not inst.closed  # never close an instance while a thread is inside it
        inst.gate.set()  # type: ignore[union-attr]
        await until(lambda: inst.closed)

    run(main)


def sequence_request(cid: int, value: float, flags: int = 0) -> BoundRequest:
    data = np.full((1, 1), value, dtype=np.float32)
    return BoundRequest(
        inputs={"IN": data},
        rows=1,
        shape_key=((1,),),
        output_names=["OUT"],
        correlation_id=cid,
        flags=flags,
    )


def test_a_stuck_sequence_instance_refuses_its_sequences_until_it_returns() -> None:
    async def main() -> None:
        config = text_format.Parse(
            """
            name: "s"
            max_batch_size: 4
            input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
            output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
            sequence_batching { direct { } }
            """,
            mc.ModelConfig(),
        )
        opts = read_sequence_options(config, Path("s"))
        assert opts is not None
        inst = Instance(gate=threading.Event())
        batcher = SequenceBatcher("s", [inst], opts, "1", execution_timeout_s=TIMEOUT_S)
        error = await failure(batcher, sequence_request(7, -1, SEQUENCE_START))
        assert error.kind is ErrorKind.DEADLINE_EXCEEDED
        assert "model 's' version 1" in error.message
        refused = await failure(batcher, sequence_request(7, 2))
        assert refused.kind is ErrorKind.UNAVAILABLE
        assert "(instance 0) is stuck" in refused.message
        assert batcher.serving_instances() == 0
        inst.gate.set()  # type: ignore[union-attr]
        await until(lambda: batcher.serving_instances() == 1)
        outs, _ = await batcher.submit(sequence_request(7, 3))
        assert outs["OUT"].tolist() == [[6.0]]
        await batcher.stop()

    run(main)
