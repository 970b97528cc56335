"""The sequence table (slots, backlog, release, idle expiry) and batch formation (direct and
oldest, control inputs, implicit state), driven directly: no threads, no model, a fake
clock. The end-to-end behaviour is in tests/integration/scheduling/test_sequences.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.onnx import OnnxBackend
from inferd.config.model_config import ConfigError
from inferd.errors import ErrorKind, InferdError
from inferd.scheduling.pending import BatchClose, Pending
from inferd.scheduling.sequence.sequence_batches import attach_controls, form_batch, keep_states
from inferd.scheduling.sequence.sequence_config import SequenceOptions, read_sequence_options
from inferd.scheduling.sequence.sequence_table import END, IDLE, SequenceTable
from inferd.tensors.signature import BoundRequest
from inferd.types import SEQUENCE_END, SEQUENCE_START, Array
from tests.support.models import builders
from tests.support.sequence_models import accumulator_onnx

START, STOP = SEQUENCE_START, SEQUENCE_END

CONTROLS = """
  control_input [
    { name: "START", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] },
    { name: "END", control [ { kind: CONTROL_SEQUENCE_END, fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY", control [ { kind: CONTROL_SEQUENCE_READY, bool_false_true: [ 0, 1 ] } ] },
    { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "S_IN", output_name: "S_OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]
"""


def config(strategy: str = "direct { }", body: str = CONTROLS, extra: str = "") -> mc.ModelConfig:
    text = f"""
        name: "m"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        sequence_batching {{ {strategy} {body} }}
        {extra}
    """
    return text_format.Parse(text, mc.ModelConfig())


def options(strategy: str = "direct { }", body: str = CONTROLS) -> SequenceOptions:
    opts = read_sequence_options(config(strategy, body), Path("m"))
    assert opts is not None
    return opts


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(cid: int | str, flags: int = 0, value: float = 1.0, width: int = 1) -> BoundRequest:
    data = np.full((1, width), value, dtype=np.float32)
    return BoundRequest({"IN": data}, 1, ((width,),), ["OUT"], correlation_id=cid, flags=flags)


class Harness:
    """A table plus the submit side of the batcher: admit, then queue the request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lanes: int = 1, slots: int = 2) -> None:
        self.loop = loop
        self.clock = Clock()
        self.table = SequenceTable("m", lanes, slots, idle_s=1.0, clock=self.clock)
        self.filler: asyncio.Future[object] = loop.create_future()
        self.filler.cancel()
        self.enqueued = 0

    def send(self, req: BoundRequest, opts: SequenceOptions | None = None) -> Pending:
        if opts is not None:
            attach_controls(opts, req)  # as SequenceBatcher.submit does
        entry = self.table.admit(req)
        self.enqueued += 1  # distinct arrival times, in order
        pending = Pending(req, self.loop.create_future(), enqueued_ns=self.enqueued)
        entry.queue.append(pending)
        return pending

    def finish(self, *cids: int | str) -> None:
        """The batch holding these sequences' requests completed."""
        for cid in cids:
            entry = self.table.by_id[cid]
            entry.executing = False
            self.table.step_done(entry, self.clock())


# -- the table ----------------------------------------------------------------------------


def test_a_sequence_must_start_and_stays_in_its_slot_until_its_end(
    loop: asyncio.AbstractEventLoop,
) -> None:
    h = Harness(loop, lanes=2, slots=2)
    with pytest.raises(InferdError) as err:
        h.table.admit(request(7))
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "sequence 7 to model 'm' must specify the START flag" in err.value.message
    h.send(request(7, START))
    entry = h.table.by_id[7]
    where = (entry.lane, entry.slot)
    h.finish(7)
    h.send(request(7))
    h.send(request(7, STOP))
    assert (entry.lane, entry.slot) == where
    with pytest.raises(InferdError, match="sequence 7 .* already ended"):
        h.table.admit(request(7))  # END sent (not yet executed): nothing may follow it
    entry.queue.clear()
    h.finish(7)
    assert 7 not in h.table.by_id and h.table.released[END] == 1
    with pytest.raises(InferdError, match=r"\(sequence 7 already ended\)"):
        h.table.admit(request(7))


def test_sequences_spread_over_instances_and_wait_in_the_backlog_for_a_free_slot(
    loop: asyncio.AbstractEventLoop,
) -> None:
    h = Harness(loop, lanes=2, slots=1)
    for cid in (1, 2, 3):
        h.send(request(cid, START | STOP))
    lanes = {h.table.by_id[cid].lane for cid in (1, 2)}
    assert lanes == {0, 1}  # one sequence per instance before any shares one
    assert [e.correlation_id for e in h.table.backlog] == [3]
    assert h.table.active() == 2
    first = h.table.by_id[1]
    lane = first.lane
    first.queue.clear()
    taker = h.table.step_done(first, h.clock())  # 1 ended: 3 takes its slot
    assert taker is h.table.by_id[3] and (taker.lane, taker.slot) == (lane, 0)
    assert (first.lane, first.slot) == (-1, -1)
    assert not h.table.backlog


def test_idle_sequences_expire_on_time_and_a_late_request_is_told_why(
    loop: asyncio.AbstractEventLoop,
) -> None:
    h = Harness(loop, lanes=1, slots=1)
    h.send(request(1, START))
    h.table.by_id[1].queue.clear()
    h.finish(1)  # idle from t=100
    h.send(request(2, START))  # no slot: backlogged
    assert h.table.next_expiry() == pytest.approx(101.0)
    assert h.table.expire(100.9) == []
    (taker,) = h.table.expire(101.0)
    assert taker.correlation_id == 2 and taker.has_slot
    assert h.table.released[IDLE] == 1 and 1 not in h.table.by_id
    with pytest.raises(InferdError, match="released after 1 s without requests"):
        h.table.admit(request(1))


def test_a_request_arriving_in_time_keeps_its_sequence_alive(
    loop: asyncio.AbstractEventLoop,
) -> None:
    h = Harness(loop, lanes=1, slots=1)
    h.send(request(1, START)).future.cancel()
    h.finish(1)  # idle from t=100
    h.clock.now = 100.5
    h.send(request(1))  # busy again: the idle mark of t=100 is stale
    assert h.table.expire(101.0) == [] and 1 in h.table.by_id
    h.table.by_id[1].queue.clear()
    h.finish(1)  # idle from t=100.5
    assert h.table.next_expiry() == pytest.approx(101.5)


def test_a_start_before_the_end_restarts_the_sequence_in_its_slot(
    loop: asyncio.AbstractEventLoop,
) -> None:
    h = Harness(loop, lanes=1, slots=2)
    h.send(request(5, START))
    h.send(request(5, STOP))
    h.send(request(5, START))  # after the END was sent: the next sequence of id 5
    entry = h.table.by_id[5]
    assert len(entry.queue) == 3 and not entry.ending


# -- batch formation ----------------------------------------------------------------------


def test_direct_fills_empty_slots_below_a_ready_one_with_not_ready_rows(
    loop: asyncio.AbstractEventLoop,
) -> None:
    opts = options()
    h = Harness(loop, lanes=1, slots=4)
    for cid in (11, 12, 13):
        h.send(request(cid, START, value=cid), opts)
    h.table.by_id[11].queue.clear()  # slot 0 has nothing ready; slots 1 and 2 do
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None
    assert [e.correlation_id if e else None for e in batch.entries] == [None, 12, 13]
    assert [p.filler for p in batch.pendings] == [True, False, False]
    ins = {
        n: np.concatenate([p.request.inputs[n] for p in batch.pendings])
        for n in opts.server_inputs()
    }
    assert ins["READY"].tolist() == [[False], [True], [True]]
    assert ins["CORRID"].tolist() == [[0], [12], [13]]
    assert ins["START"].tolist() == [[0], [1], [1]] and ins["START"].dtype == np.int32
    assert ins["END"].tolist() == [[0.0], [0.0], [0.0]] and ins["END"].dtype == np.float32
    assert ins["S_IN"].tolist() == [[0.0, 0.0]] * 3  # the initial state
    assert batch.reason is BatchClose.QUEUE_EMPTY
    assert h.table.by_id[12].executing and not h.table.by_id[12].queue


def test_a_batch_takes_one_request_per_sequence_in_its_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    opts = options()
    h = Harness(loop, lanes=1, slots=2)
    first = h.send(request(1, START, value=1))
    second = h.send(request(1, value=2))
    h.send(request(2, START, value=3))
    third = h.table.by_id[2].queue[0]
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None and batch.pendings == [first, third]
    assert list(h.table.by_id[1].queue) == [second]  # waits for the next batch
    assert form_batch(opts, h.table.lanes[0], h.filler) is None  # both are executing


def test_oldest_takes_the_oldest_heads_up_to_the_largest_preferred_size(
    loop: asyncio.AbstractEventLoop,
) -> None:
    opts = options("oldest { max_candidate_sequences: 6 preferred_batch_size: [ 2 ] }")
    assert opts.slots == 6 and opts.batch_rows == 4
    h = Harness(loop, lanes=1, slots=6)
    for cid in (21, 22, 23):
        h.send(request(cid, START))
    h.table.by_id[21].queue.clear()
    late = h.send(request(21, START))  # 21's head is now the newest of the three
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None and batch.reason is BatchClose.PREFERRED_SIZE
    assert [e.correlation_id for e in batch.entries if e] == [22, 23]
    assert not any(p.filler for p in batch.pendings)
    assert h.table.by_id[21].queue[0] is late


def test_only_requests_of_equal_shapes_share_a_batch(loop: asyncio.AbstractEventLoop) -> None:
    opts = options("oldest { }")
    h = Harness(loop, lanes=1, slots=4)
    h.send(request(1, START, width=3))
    h.send(request(2, START, width=5))
    h.send(request(3, START, width=3))
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None and batch.reason is BatchClose.SHAPE_MISMATCH
    assert [e.correlation_id for e in batch.entries if e] == [1, 3]


def test_state_outputs_become_the_next_steps_state_and_start_resets_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    opts = options()
    h = Harness(loop, lanes=1, slots=2)
    h.send(request(1, START))
    h.send(request(2, START))
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None
    results: list[dict[str, Array] | InferdError] = [
        {"OUT": np.ones((1, 1)), "S_OUT": np.array([[1.0, 2.0]])},
        {"OUT": np.ones((1, 1)), "S_OUT": np.array([[1.0]])},  # wrong shape: fails alone
    ]
    kept = keep_states(opts, batch.entries, results, shared=True)
    assert kept[0] is results[0]
    assert isinstance(kept[1], InferdError) and "state output 'S_OUT' has shape [1, 1]" in str(
        kept[1]
    )
    h.finish(1, 2)
    h.send(request(1))
    h.send(request(2))
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None
    states = [p.request.inputs["S_IN"].tolist() for p in batch.pendings]
    assert states == [[[1.0, 2.0]], [[0.0, 0.0]]]  # 2 kept its (initial) state
    h.finish(1, 2)
    h.send(request(1, START))  # a new sequence of id 1: the initial state again
    batch = form_batch(opts, h.table.lanes[0], h.filler)
    assert batch is not None and batch.pendings[0].request.inputs["S_IN"].tolist() == [[0.0, 0.0]]


def test_a_sequence_id_must_fit_the_corrid_control() -> None:
    int32 = CONTROLS.replace("TYPE_UINT64", "TYPE_INT32")
    opts = options(body=int32)
    assert opts.id_problem(2**31 - 1) == ""
    assert "takes sequence ids up to 2147483647" in opts.id_problem(2**31)
    assert "takes integer sequence ids" in opts.id_problem("abc")
    text = options(body=CONTROLS.replace("TYPE_UINT64", "TYPE_STRING"))
    assert text.id_problem("abc") == "" and text.id_problem(2**64 - 1) == ""
    assert text.control_tensors(42, 0)["CORRID"].tolist() == [[b"42"]]


# -- the config ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sequence", "extra", "message"),
    [
        ("direct { minimum_slot_utilization: 2 }", "", "minimum_slot_utilization: must be"),
        (
            'control_input [ { name: "S", control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
            "",
            "control_input 'S': CONTROL_SEQUENCE_START needs exactly one of int32_false_true",
        ),
        (
            'control_input [ { name: "C", control [ { kind: CONTROL_SEQUENCE_CORRID } ] } ]',
            "",
            "control_input 'C': CONTROL_SEQUENCE_CORRID data_type must be one of",
        ),
        (
            'control_input [ { name: "IN", control [ { kind: CONTROL_SEQUENCE_READY '
            "int32_false_true: [ 0, 1 ] } ] } ]",
            "",
            "control_input 'IN': also declared under input",
        ),
        (
            'state [ { input_name: "S" output_name: "T" data_type: TYPE_FP32 dims: [ 2 ] '
            "initial_state: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } ]",
            "",
            "state 'S'.initial_state: dims [3] do not fit the state's dims [2]",
        ),
        (
            'state [ { input_name: "S" output_name: "T" data_type: TYPE_FP32 dims: [ 2 ] '
            'initial_state: { data_type: TYPE_FP32 dims: [ 2 ] data_file: "nope" } } ]',
            "",
            "state 'S'.initial_state: data_file m/initial_state/nope not found",
        ),
    ],
)
def test_an_inconsistent_sequence_batching_fails_the_load_naming_the_field(
    sequence: str, extra: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        read_sequence_options(config("", sequence, extra), Path("m"))
    assert "m/config.pbtxt: sequence_batching" in str(err.value)
    assert message in str(err.value)


def test_initial_state_comes_from_its_data_file(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "initial_state").mkdir(parents=True)
    (model / "initial_state" / "s.bin").write_bytes(np.array([3, 4], "<f4").tobytes())
    body = (
        'state [ { input_name: "S" output_name: "T" data_type: TYPE_FP32 dims: [ -1 ] '
        'initial_state: { data_type: TYPE_FP32 dims: [ 2 ] data_file: "s.bin" } } ]'
    )
    opts = read_sequence_options(config("oldest { }", body), model)
    assert opts is not None and opts.initial_states()["S"].tolist() == [[3.0, 4.0]]
    assert opts.idle_s == 1.0  # Triton's default max_sequence_idle_microseconds


def test_onnx_auto_completion_leaves_control_and_state_tensors_to_the_server(
    tmp_path: Path,
) -> None:
    version = tmp_path / "acc" / "1"
    builders._save(accumulator_onnx(), version / "model.onnx")
    cfg = text_format.Parse(
        """
        name: "acc"
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        sequence_batching {
          control_input [ { name: "START", control [
            { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32
                    dims: [ 1 ] } ]
        }
        """,
        mc.ModelConfig(),
    )
    OnnxBackend().complete_config(cfg, version)
    assert [i.name for i in cfg.input] == ["IN"] and [o.name for o in cfg.output] == ["OUT"]
    cfg.sequence_batching.control_input[0].name = "BEGIN"
    with pytest.raises(ConfigError, match="sequence_batching names input 'BEGIN'"):
        OnnxBackend().complete_config(cfg, version)
