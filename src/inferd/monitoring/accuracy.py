"""Online accuracy: per model version, the share of the last N labelled rows it got right."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class AccuracyWindow:
    """The last `size` labelled rows, right or wrong. Recorded on the event loop; `value`
    is read by scrapes from another thread, so the pair it reads is one assignment."""

    __slots__ = ("_rows", "_right", "counts")

    def __init__(self, size: int) -> None:
        self._rows: deque[bool] = deque(maxlen=size)
        self._right = 0
        self.counts = (0, 0)  # (right, rows) in the window

    def record(self, outcomes: Iterable[bool]) -> None:
        rows = self._rows
        for right in outcomes:
            if len(rows) == rows.maxlen and rows[0]:
                self._right -= 1
            rows.append(right)
            self._right += right
        self.counts = (self._right, len(rows))

    @property
    def value(self) -> float | None:
        """The accuracy over the window; None before the first label."""
        right, rows = self.counts
        return right / rows if rows else None


def canary_is_worse(
    canary: AccuracyWindow | None, stable: AccuracyWindow | None, margin: float, min_rows: int
) -> bool:
    """Whether a canary's accuracy is below its stable version's by more than `margin`,
    both over at least `min_rows` labelled rows (fewer: too early to judge)."""
    if canary is None or stable is None:
        return False
    (canary_right, canary_rows), (stable_right, stable_rows) = canary.counts, stable.counts
    if canary_rows < min_rows or stable_rows < min_rows:
        return False
    return canary_right / canary_rows < stable_right / stable_rows - margin
