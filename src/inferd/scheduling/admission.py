"""Deadline-aware admission: refuse at once a request that cannot be answered in time.

Two different answers, so that a client knows what to do: a deadline shorter than one
execution can never be met, however idle the model, so a retry would fail the same way and
it is the request's own error (400 / INVALID_ARGUMENT); a deadline that only the work queued
ahead of it makes too short is load to shed (429 / RESOURCE_EXHAUSTED, retry later).
"""

from __future__ import annotations

from inferd.errors import invalid, shed
from inferd.types import InferRequest


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
        raise invalid(
            f"model '{model}' cannot answer within the request's deadline: its typical "
            f"execution time is about {exec_s * 1000:.1f} ms, and the request allows "
            f"{remaining_s * 1000:.1f} ms; allow it more time"
        )
    if estimate_s > remaining_s:
        raise shed(
            f"model '{model}' cannot meet the request's deadline now: about "
            f"{(estimate_s - exec_s) * 1000:.1f} ms of work ahead of it (queued or executing) "
            f"and {exec_s * 1000:.1f} ms for its own execution, {remaining_s * 1000:.1f} ms "
            "left; retry later"
        )
