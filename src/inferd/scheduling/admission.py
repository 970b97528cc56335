"""Admission: which priority level a request queues at, its deadline, and the refusals that
come before it queues (a full level, a deadline passed or that cannot be met). Pure
functions of the request and the queue's counts; the batcher (`batcher.py`) applies them.

Deadlines: two different answers, so that a client knows what to do: a deadline shorter than one
execution can never be met, however idle the model, so a retry would fail the same way and
it is the request's own error (400 / INVALID_ARGUMENT); a deadline that only the work queued
ahead of it makes too short is load to shed (429 / RESOURCE_EXHAUSTED, retry later).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferd.errors import (
    DeadlineUnmeetableError,
    ErrorKind,
    deadline_exceeded,
    invalid,
    shed,
)
from inferd.scheduling.queues import QueuePolicy
from inferd.types import InferRequest


@dataclass(frozen=True, slots=True)
class Admission:
    """Where an admitted request waits, and until when."""

    level: int  # 0-based priority level (0 = Triton's priority 1, the highest)
    deadline_ns: int | None  # perf_counter_ns; None: it may wait as long as it takes
    remaining_s: float | None  # from now to the deadline


def admit(
    model: str,
    policies: Sequence[QueuePolicy],
    default_level: int,
    waiting: Sequence[int],
    priority: int,
    timeout_us: int,
    deadline_ns: int | None,
    now_ns: int,
) -> Admission:
    """Admit a request or raise why not.

    `waiting` is how many live requests wait at each level (cancelled ones do not count);
    `priority` Triton's level (1 = highest, 0 = the model's default); `timeout_us` the
    request's own queue timeout (used if the level's policy allows an override);
    `deadline_ns` the client's own deadline. A full level sheds (RESOURCE_EXHAUSTED); a
    deadline already passed is DEADLINE_EXCEEDED; a queue timeout with action REJECT
    shortens the deadline.
    """
    level = priority_level(model, len(policies), default_level, priority)
    policy = policies[level]
    if policy.max_queue_size and waiting[level] >= policy.max_queue_size:
        raise shed(
            f"model '{model}' queue is full ({policy.max_queue_size} requests at "
            f"priority {level + 1}); retry later"
        )
    queue_timeout_us = (
        timeout_us if timeout_us and policy.allow_timeout_override else policy.default_timeout_us
    )
    if queue_timeout_us and policy.reject_on_timeout:
        own = now_ns + queue_timeout_us * 1000
        deadline_ns = own if deadline_ns is None else min(deadline_ns, own)
    if deadline_ns is None:
        return Admission(level, None, None)
    remaining_s = (deadline_ns - now_ns) / 1e9
    if remaining_s <= 0:
        raise deadline_exceeded(f"model '{model}': the request's deadline passed")
    return Admission(level, deadline_ns, remaining_s)


def unconditional(policies: Sequence[QueuePolicy], default_level: int) -> Admission | None:
    """What `admit` answers every request without a priority, a timeout or a deadline, when
    its (default) level has no queue bound and no timeout that rejects: decided once per
    scheduler, so that such a request (most are) costs no call here. None otherwise."""
    policy = policies[default_level]
    if policy.max_queue_size or (policy.default_timeout_us and policy.reject_on_timeout):
        return None
    return Admission(default_level, None, None)


def priority_level(model: str, levels: int, default_level: int, priority: int) -> int:
    """The 0-based level of Triton's `priority` (1..levels; 0: the model's default)."""
    if priority == 0:
        return default_level
    if not 1 <= priority <= levels:
        raise invalid(
            f"priority {priority} is outside 1..{levels} (priority_levels of model '{model}')"
        )
    return priority - 1


def full(policies: Sequence[QueuePolicy], waiting: Sequence[int]) -> bool:
    """Every level is bounded and full: any request would be shed."""
    return all(
        policy.max_queue_size and count >= policy.max_queue_size
        for policy, count in zip(policies, waiting, strict=True)
    )


def scheduling_parameters(request: InferRequest) -> tuple[int, int]:
    """Triton's request parameters `priority` (level, 0 = default) and `timeout` (µs)."""
    if not request.parameters:
        return 0, 0  # the common case, on every request
    values = []
    for key in ("priority", "timeout"):
        value = request.parameters.get(key, 0)
        # Triton's are uint64: a JSON integer past that (10**400) cannot become a deadline.
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise invalid(
                f"request parameter '{key}' must be an integer >= 0 and below 2**64, got "
                f"{value!r:.40}"
            )
        values.append(value)
    return values[0], values[1]


def refuse_unmeetable_deadline(
    model: str, exec_s: float | None, estimate_s: float | None, remaining_s: float
) -> None:
    """Raise when a request with `remaining_s` left cannot be answered in time.

    `exec_s` is the model's typical (recent) execution time, `estimate_s` how long a request
    arriving now would take, queued work included; both None until an execution was timed,
    and then nothing is refused: there are no grounds yet.
    """
    if exec_s is None or estimate_s is None:
        return
    if exec_s > remaining_s:
        raise DeadlineUnmeetableError(
            ErrorKind.INVALID_ARGUMENT,
            f"model '{model}' cannot answer within the request's deadline: its typical "
            f"execution time is about {exec_s * 1000:.1f} ms, and the request allows "
            f"{remaining_s * 1000:.1f} ms; allow it more time",
            exec_s,
        )
    if estimate_s > remaining_s:
        raise DeadlineUnmeetableError(
            ErrorKind.RESOURCE_EXHAUSTED,
            f"model '{model}' cannot meet the request's deadline now: about "
            f"{(estimate_s - exec_s) * 1000:.1f} ms of work ahead of it (queued or executing) "
            f"and {exec_s * 1000:.1f} ms for its own execution, {remaining_s * 1000:.1f} ms "
            "left; retry later",
            estimate_s,
        )
