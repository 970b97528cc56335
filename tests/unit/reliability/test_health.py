"""The health window: its score, and recording racing with scoring from other threads."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from inferd.reliability.health_score import IDLE_SCORE, HealthWindow


def test_idle_window_scores_the_idle_score() -> None:
    assert HealthWindow().score(None) == IDLE_SCORE


def test_a_version_failing_every_request_scores_zero() -> None:
    window = HealthWindow()
    for _ in range(10):
        window.record(0.01, False)
    assert window.score(None) == 0.0


def test_at_its_best_latency_with_no_errors() -> None:
    window = HealthWindow()
    for _ in range(100):
        window.record(0.01, True)
    # p99 = the best p99, so the latency term is 1 - 1/4; full throughput; no errors.
    assert window.score(None) == pytest.approx(0.4 * 0.75 + 0.3 + 0.3)
    # At its configured baseline the latency term is 0.
    assert window.score(0.01) == pytest.approx(0.3 + 0.3)


def test_expired_samples_leave_the_window() -> None:
    window = HealthWindow(window_s=0.05)
    for _ in range(5):
        window.record(0.01, False)
    assert window.score(None) == 0.0
    expires = time.monotonic() + 0.05
    while time.monotonic() <= expires:  # the window's own clock, not another thread
        time.sleep(0.01)
    assert window.score(None) == IDLE_SCORE
    assert len(window) == 0


def test_recording_while_other_threads_score_loses_nothing_and_never_raises() -> None:
    """The event loop appends while scrape threads (several at once) score: issue #13's
    `deque mutated during iteration`, provoked with thread switches every few µs."""
    window = HealthWindow()
    records = 100_000
    errors: list[BaseException] = []
    done = threading.Event()

    def score() -> None:
        try:
            while not done.is_set():
                assert 0.0 <= window.score(None) <= 1.0
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    scorers = [threading.Thread(target=score) for _ in range(2)]
    try:
        for t in scorers:
            t.start()
        for i in range(records):
            window.record(0.001 * (i % 7), i % 10 != 0)
    finally:
        done.set()
        for t in scorers:
            t.join()
        sys.setswitchinterval(interval)
    assert not errors, repr(errors[0])
    assert len(window) == records  # all within the minute: none expired, none lost
