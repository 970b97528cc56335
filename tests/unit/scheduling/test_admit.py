"""`admit`: priority levels, queue limits and deadlines, before a request queues."""

from __future__ import annotations

import pytest

from inferd.errors import ErrorKind, InferdError
from inferd.scheduling.admission import Admission, admit, full, unconditional
from inferd.scheduling.queues import PriorityQueues, QueuePolicy

NOW = 10**12  # ns
US = 1000  # ns
TWO_LEVELS = (QueuePolicy(max_queue_size=2), QueuePolicy())


def admitted(
    policies: tuple[QueuePolicy, ...] = TWO_LEVELS,
    waiting: tuple[int, ...] = (0, 0),
    priority: int = 0,
    timeout_us: int = 0,
    deadline_ns: int | None = None,
    default_level: int = 1,
) -> Admission:
    return admit("m", policies, default_level, waiting, priority, timeout_us, deadline_ns, NOW)


def refused(**kwargs: object) -> InferdError:
    with pytest.raises(InferdError) as info:
        admitted(**kwargs)  # type: ignore[arg-type]
    return info.value


def test_priority_zero_is_the_models_default_level() -> None:
    assert admitted().level == 1
    assert admitted(priority=1).level == 0
    assert admitted(priority=2).level == 1


@pytest.mark.parametrize("priority", [3, 2**40])
def test_a_priority_outside_the_levels_is_the_clients_error(priority: int) -> None:
    error = refused(priority=priority)
    assert error.kind is ErrorKind.INVALID_ARGUMENT
    assert f"priority {priority} is outside 1..2" in error.message


def test_a_full_level_sheds_and_names_it() -> None:
    error = refused(waiting=(2, 0), priority=1)
    assert error.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "2 requests at priority 1" in error.message
    assert admitted(waiting=(2, 50), priority=2).level == 1  # the other level is unbounded


def test_only_live_requests_fill_a_level() -> None:
    """A cancelled request leaves the counts at once, though it is still in its FIFO."""
    queues: PriorityQueues[str] = PriorityQueues(2)
    queues.append("gone", 0)
    queues.append("kept", 0)
    assert refused(waiting=tuple(queues.waiting), priority=1).kind is ErrorKind.RESOURCE_EXHAUSTED
    queues.left(0)  # "gone" was cancelled
    assert len(queues) == 2
    assert (queues.waiting, queues.waiting_total) == ([1, 0], 1)
    assert admitted(waiting=tuple(queues.waiting), priority=1).level == 0


def test_no_deadline_and_no_queue_timeout_waits_as_long_as_it_takes() -> None:
    assert admitted() == Admission(1, None, None)


def test_the_clients_deadline_is_kept() -> None:
    a = admitted(deadline_ns=NOW + 5000 * US)
    assert (a.deadline_ns, a.remaining_s) == (NOW + 5000 * US, 0.005)


def test_a_passed_deadline_is_refused_before_it_queues() -> None:
    assert refused(deadline_ns=NOW).kind is ErrorKind.DEADLINE_EXCEEDED


def test_a_rejecting_queue_timeout_shortens_the_deadline() -> None:
    policies = (QueuePolicy(default_timeout_us=100),)
    assert admitted(policies, (0,), default_level=0).deadline_ns == NOW + 100 * US
    sooner = admitted(policies, (0,), deadline_ns=NOW + 50 * US, default_level=0)
    assert sooner.deadline_ns == NOW + 50 * US


def test_a_requests_timeout_replaces_the_default_only_when_allowed() -> None:
    fixed = (QueuePolicy(default_timeout_us=100),)
    assert admitted(fixed, (0,), timeout_us=7, default_level=0).deadline_ns == NOW + 100 * US
    overridable = (QueuePolicy(default_timeout_us=100, allow_timeout_override=True),)
    own = admitted(overridable, (0,), timeout_us=7, default_level=0)
    assert own.deadline_ns == NOW + 7 * US


def test_a_delaying_queue_timeout_sets_no_deadline() -> None:
    delay = (QueuePolicy(default_timeout_us=100, reject_on_timeout=False),)
    assert admitted(delay, (0,), default_level=0).deadline_ns is None


def test_full_only_when_every_level_is_bounded_and_full() -> None:
    bounded = (QueuePolicy(max_queue_size=1), QueuePolicy(max_queue_size=2))
    assert full(bounded, [1, 2])
    assert not full(bounded, [1, 1])
    assert not full(TWO_LEVELS, [2, 10**6])  # level 2 is unbounded


@pytest.mark.parametrize(
    "policy",
    [
        QueuePolicy(),
        QueuePolicy(default_timeout_us=5, reject_on_timeout=False),  # DELAY: no deadline
        QueuePolicy(allow_timeout_override=True),
    ],
)
def test_the_unconditional_admission_is_what_admit_answers_a_plain_request(
    policy: QueuePolicy,
) -> None:
    """A request without priority, timeout or deadline, at a level with no bound: the
    batcher takes `unconditional`'s answer instead of calling `admit`; it must be admit's."""
    policies = (QueuePolicy(max_queue_size=1), policy)
    assert unconditional(policies, 1) == admitted(policies, waiting=(5, 10**6))


@pytest.mark.parametrize(
    "policy", [QueuePolicy(max_queue_size=3), QueuePolicy(default_timeout_us=5)]
)
def test_a_level_with_a_bound_or_a_rejecting_timeout_admits_each_request(
    policy: QueuePolicy,
) -> None:
    assert unconditional((policy,), 0) is None  # admit decides, request by request
    assert admitted((policy,), waiting=(0,), default_level=0).deadline_ns == (
        None if policy.max_queue_size else NOW + 5 * US
    )
