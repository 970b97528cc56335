"""`form_batch`: which queued requests leave together and why, without threads or a loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.scheduling.formation import Formation, FormationOptions, form_batch
from inferd.scheduling.pending import BatchClose
from inferd.scheduling.queues import PriorityQueues

MS = 1_000_000  # ns
NOW = 1_000 * MS


@dataclass(slots=True)
class Shape:
    rows: int
    shape_key: tuple[tuple[int, ...], ...]
    length: int = 0


@dataclass(slots=True)
class Entry:
    """A queued request as formation sees it."""

    name: str
    rows: int = 1
    shape_key: tuple[tuple[int, ...], ...] = ((4,),)
    enqueued_ns: int = NOW
    deadline_ns: int | None = None
    is_queued: bool = True  # False: cancelled, timed out

    @property
    def request(self) -> Shape:
        return Shape(self.rows, self.shape_key)


def opts(**kwargs: Any) -> FormationOptions:
    kwargs.setdefault("max_batch_size", 8)
    return FormationOptions(**kwargs)


def names(formed: Formation[Entry]) -> list[str]:
    return [e.name for e in formed.batch]


def queue(*rows: int) -> list[Entry]:
    return [Entry(f"r{i}", n) for i, n in enumerate(rows)]


def test_an_empty_queue_forms_nothing() -> None:
    formed: Formation[Entry] = form_batch([], opts(), NOW)
    assert (formed.batch, formed.reason, formed.taken) == ([], BatchClose.QUEUE_EMPTY, 0)


def test_what_is_queued_leaves_together_when_it_fits() -> None:
    formed = form_batch(queue(1, 2, 1), opts(), NOW)
    assert names(formed) == ["r0", "r1", "r2"]
    assert (formed.reason, formed.taken) == (BatchClose.QUEUE_EMPTY, 3)


def test_a_full_batch_closes_at_max_batch_size() -> None:
    formed = form_batch(queue(*[1] * 6), opts(max_batch_size=4), NOW)
    assert names(formed) == ["r0", "r1", "r2", "r3"]
    assert (formed.reason, formed.taken) == (BatchClose.FULL, 4)


def test_a_request_that_would_overflow_waits_for_the_next_batch() -> None:
    formed = form_batch(queue(3, 2, 1), opts(max_batch_size=4), NOW)
    assert names(formed) == ["r0"]  # r2 would fit, but queue order is kept
    assert (formed.reason, formed.taken) == (BatchClose.FULL, 1)


def test_the_largest_preferred_size_the_queue_fills_exactly() -> None:
    formed = form_batch(queue(*[1] * 5), opts(preferred_sizes=(2, 4, 6)), NOW)
    assert names(formed) == ["r0", "r1", "r2", "r3"]
    assert (formed.reason, formed.taken) == (BatchClose.PREFERRED_SIZE, 4)


def test_a_preferred_size_is_taken_when_the_next_request_would_overflow() -> None:
    formed = form_batch(queue(1, 1, 1, 1, 1, 4), opts(preferred_sizes=(4,)), NOW)
    assert names(formed) == ["r0", "r1", "r2", "r3"]  # not the 5 rows before the overflow
    assert (formed.reason, formed.taken) == (BatchClose.PREFERRED_SIZE, 4)


def test_max_batch_size_wins_over_a_preferred_size_it_equals() -> None:
    formed = form_batch(queue(2, 2, 2), opts(max_batch_size=4, preferred_sizes=(4,)), NOW)
    assert (names(formed), formed.reason) == (["r0", "r1"], BatchClose.FULL)


def test_a_preferred_size_no_prefix_fills_is_not_used() -> None:
    formed = form_batch(queue(3, 3), opts(preferred_sizes=(4,)), NOW)
    assert names(formed) == ["r0", "r1"]
    assert formed.reason is BatchClose.QUEUE_EMPTY


def test_a_shape_mismatch_closes_the_batch_in_queue_order() -> None:
    entries = queue(1, 1, 1, 1)
    entries[2].shape_key = ((5,),)
    formed = form_batch(entries, opts(), NOW)
    assert names(formed) == ["r0", "r1"]
    assert (formed.reason, formed.taken) == (BatchClose.SHAPE_MISMATCH, 2)


def test_requests_sending_different_optional_inputs_do_not_merge() -> None:
    # The signature's key ends with which optional inputs a request sends.
    with_opt, without = ((4,), (2,), (1,)), ((4,), (0,))
    entries = [Entry("a", shape_key=with_opt), Entry("b", shape_key=without)]
    formed = form_batch(entries, opts(), NOW)
    assert (names(formed), formed.reason) == (["a"], BatchClose.SHAPE_MISMATCH)


def test_ragged_requests_merge_when_their_keys_are_equal() -> None:
    # Ragged inputs are left out of the key: requests of different lengths share one.
    entries = [Entry("short", shape_key=()), Entry("long", shape_key=())]
    assert names(form_batch(entries, opts(), NOW)) == ["short", "long"]


def test_higher_priority_levels_leave_first() -> None:
    levels: PriorityQueues[Entry] = PriorityQueues(3)
    levels.append(Entry("low"), 2)
    levels.append(Entry("mid"), 1)
    levels.append(Entry("high-1"), 0)
    levels.append(Entry("high-2"), 0)
    formed = form_batch(levels, opts(max_batch_size=3), NOW)
    assert names(formed) == ["high-1", "high-2", "mid"]
    assert formed.taken == 3
    assert [levels.popleft().name for _ in range(formed.taken)] == ["high-1", "high-2", "mid"]


def test_dead_entries_are_skipped_and_popped_with_the_batch() -> None:
    entries = queue(1, 1, 1)
    entries[0].is_queued = entries[1].is_queued = False
    formed = form_batch(entries, opts(), NOW)
    assert (names(formed), formed.taken, formed.expired) == (["r2"], 3, [])


def test_expired_deadlines_never_execute() -> None:
    entries = queue(1, 1, 1)
    entries[1].deadline_ns = NOW  # passed now
    entries[2].deadline_ns = NOW + MS
    formed = form_batch(entries, opts(), NOW)
    assert names(formed) == ["r0", "r2"]
    assert [e.name for e in formed.expired] == ["r1"]
    assert formed.taken == 3


def test_a_queue_of_only_dead_or_expired_entries_is_popped_whole() -> None:
    entries = queue(1, 1)
    entries[0].is_queued = False
    entries[1].deadline_ns = NOW - MS
    formed = form_batch(entries, opts(), NOW)
    assert (formed.batch, formed.taken, [e.name for e in formed.expired]) == ([], 2, ["r1"])


def test_unbatched_models_and_policy_none_take_one_request() -> None:
    for options in (opts(max_batch_size=0), opts(policy="none")):
        formed = form_batch(queue(2, 1), options, NOW)
        assert (names(formed), formed.reason, formed.taken) == (["r0"], BatchClose.FULL, 1)


def test_window_waits_for_the_oldest_requests_delay() -> None:
    window = opts(policy="window", max_delay_s=0.005)
    entries = [Entry("old", enqueued_ns=NOW - 2 * MS), Entry("new")]
    formed = form_batch(entries, window, NOW)
    assert (formed.batch, formed.taken, formed.wait_until_ns) == ([], 0, NOW + 3 * MS)
    formed = form_batch(entries, window, NOW + 3 * MS)
    assert (names(formed), formed.reason) == (["old", "new"], BatchClose.MAX_DELAY)


def test_window_leaves_at_once_when_the_next_request_cannot_join() -> None:
    entries = [Entry("a"), Entry("b", shape_key=((5,),))]
    formed = form_batch(entries, opts(policy="window", max_delay_s=9), NOW)
    assert (names(formed), formed.reason) == (["a"], BatchClose.SHAPE_MISMATCH)


def test_window_leaves_at_once_when_full_or_at_a_preferred_size() -> None:
    full = form_batch(queue(1, 1), opts(max_batch_size=2, policy="window", max_delay_s=9), NOW)
    assert (full.reason, full.wait_until_ns) == (BatchClose.FULL, None)
    window = opts(preferred_sizes=(2,), policy="window", max_delay_s=9)
    preferred = form_batch(queue(1, 1), window, NOW)
    assert (names(preferred), preferred.reason) == (["r0", "r1"], BatchClose.PREFERRED_SIZE)
