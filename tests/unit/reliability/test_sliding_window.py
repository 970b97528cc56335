"""The one sliding-window estimator (reliability/sliding_window.py) behind health, canary and
circuit:
counts, error rate and p99 over the window, at explicit times (no clock waited on)."""

from __future__ import annotations

from inferd.reliability.sliding_window import SlidingWindow, WindowSummary


def test_an_empty_window() -> None:
    assert SlidingWindow(10).summary(30.0, now=100.0) == WindowSummary(0, 0, 0.0, 0.0)
    assert SlidingWindow(10).summary(30.0).error_rate == 0.0


def test_counts_error_rate_and_p99_of_the_successes() -> None:
    window = SlidingWindow(1000)
    for i in range(100):  # latencies 0.01 .. 1.00 s at t = 100
        window.record((i + 1) / 100, True, now=100.0)
    for _ in range(25):
        window.record(0.0, False, now=100.0)
    summary = window.summary(30.0, now=101.0)
    assert (summary.requests, summary.errors, summary.first_at) == (125, 25, 100.0)
    assert summary.error_rate == 0.2
    assert summary.p99_s == 1.0  # rank int(0.99 * 100) of the sorted successes


def test_only_failures_have_no_p99() -> None:
    window = SlidingWindow(10)
    window.record(5.0, False, now=1.0)
    assert window.summary(30.0, now=1.0) == WindowSummary(1, 1, 0.0, 1.0)


def test_samples_older_than_the_window_leave_it() -> None:
    window = SlidingWindow(10)
    window.record(0.1, False, now=10.0)
    window.record(0.2, True, now=50.0)
    assert window.summary(30.0, now=60.0) == WindowSummary(1, 0, 0.2, 50.0)
    assert len(window) == 1  # the expired one is gone, not only skipped


def test_past_maxlen_the_latest_are_kept() -> None:
    window = SlidingWindow(3)
    for t in range(5):
        window.record(float(t), True, now=float(t))
    assert window.summary(100.0, now=5.0).first_at == 2.0
    window.clear()
    assert len(window) == 0
