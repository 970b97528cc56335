"""`form_length_group`: batches of similar length for a model that pads, without threads or
a loop (scheduling/length_groups.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.scheduling.formation import Formation, FormationOptions
from inferd.scheduling.length_groups import form_length_group
from inferd.scheduling.pending import BatchClose

MS = 1_000_000  # ns
NOW = 1_000 * MS


@dataclass(slots=True)
class Shape:
    rows: int
    length: int
    shape_key: tuple[tuple[int, ...], ...] = ()


@dataclass(slots=True)
class Entry:
    name: str
    length: int
    rows: int = 1
    shape_key: tuple[tuple[int, ...], ...] = ()
    enqueued_ns: int = NOW
    deadline_ns: int | None = None
    is_queued: bool = True

    @property
    def request(self) -> Shape:
        return Shape(self.rows, self.length, self.shape_key)


def opts(**kwargs: Any) -> FormationOptions:
    kwargs.setdefault("max_batch_size", 8)
    kwargs.setdefault("group_waste", 0.25)
    kwargs.setdefault("group_window", 32)
    return FormationOptions(**kwargs)


def lengths(*values: int) -> list[Entry]:
    return [Entry(f"r{i}", n) for i, n in enumerate(values)]


def names(formed: Formation[Entry]) -> list[str]:
    return [e.name for e in formed.batch]


def test_the_oldest_leaves_with_those_nearest_its_length() -> None:
    formed = form_length_group(lengths(10, 60, 11, 58, 9, 12), opts(), NOW)
    assert names(formed) == ["r0", "r2", "r4", "r5"]
    assert formed.reason is BatchClose.LENGTH  # r3 (58) would pad the batch past 25%
    assert (formed.taken, formed.scattered) == (1, True)  # only the head is popped


def test_a_long_head_leaves_with_the_long_ones_and_never_waits() -> None:
    formed = form_length_group(lengths(60, 10, 58, 11, 61), opts(), NOW)
    assert names(formed) == ["r0", "r4", "r2"]
    assert formed.reason is BatchClose.LENGTH


def test_the_padding_stays_within_the_bound() -> None:
    queue = lengths(20, 19, 18, 17, 16, 15, 14, 13, 12)
    for waste in (0.0, 0.1, 0.25, 0.5):
        batch = form_length_group(queue, opts(group_waste=waste), NOW).batch
        longest = max(e.length for e in batch)
        real = sum(e.length for e in batch)
        assert longest * len(batch) <= (1 + waste) * real
    assert names(form_length_group(queue, opts(group_waste=0.0), NOW)) == ["r0"]


def test_equal_lengths_fill_a_batch_in_queue_order() -> None:
    formed = form_length_group(lengths(*[7] * 10), opts(max_batch_size=4), NOW)
    assert names(formed) == ["r0", "r1", "r2", "r3"]
    assert formed.reason is BatchClose.FULL


def test_a_lone_request_leaves_at_once() -> None:
    formed = form_length_group(lengths(33), opts(), NOW)
    assert (names(formed), formed.reason, formed.taken) == (["r0"], BatchClose.QUEUE_EMPTY, 1)
    assert not formed.scattered


def test_rows_count_against_max_batch_size() -> None:
    queue = [Entry("a", 10, rows=5), Entry("b", 10, rows=4), Entry("c", 10, rows=3)]
    formed = form_length_group(queue, opts(max_batch_size=8), NOW)
    assert names(formed) == ["a", "c"]
    assert formed.reason is BatchClose.FULL


def test_only_the_window_is_looked_at() -> None:
    queue = lengths(10, 50, 50, 50, 10)
    assert names(form_length_group(queue, opts(group_window=3), NOW)) == ["r0"]
    assert names(form_length_group(queue, opts(group_window=4), NOW)) == ["r0", "r4"]


def test_other_shapes_are_skipped_not_a_stop() -> None:
    queue = lengths(10, 10, 10)
    queue[1].shape_key = ((3,),)
    assert names(form_length_group(queue, opts(), NOW)) == ["r0", "r2"]


def test_dead_and_expired_entries_before_the_head_are_popped() -> None:
    queue = lengths(10, 10, 10, 10)
    queue[0].is_queued = False
    queue[1].deadline_ns = NOW - 1
    queue[3].deadline_ns = NOW - 1  # past the head: found when the batcher gets there
    formed = form_length_group(queue, opts(), NOW)
    assert names(formed) == ["r2"]
    assert formed.taken == 3
    assert [e.name for e in formed.expired] == ["r1"]


def test_everything_dead_pops_it_all() -> None:
    queue = lengths(10, 10)
    for entry in queue:
        entry.is_queued = False
    formed = form_length_group(queue, opts(), NOW)
    assert (formed.batch, formed.taken) == ([], 2)


def test_a_window_waits_for_company_until_the_delay() -> None:
    queue = lengths(10, 11)
    window = opts(policy="window", max_delay_s=0.005)
    formed = form_length_group(queue, window, NOW)
    assert formed.batch == [] and formed.wait_until_ns == NOW + 5 * MS
    later = form_length_group(queue, window, NOW + 5 * MS)
    assert names(later) == ["r0", "r1"] and later.reason is BatchClose.MAX_DELAY
    cut = form_length_group(lengths(10, 60), window, NOW)
    assert names(cut) == ["r0"] and cut.reason is BatchClose.LENGTH  # closed: no wait
