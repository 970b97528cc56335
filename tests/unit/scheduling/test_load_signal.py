"""The load window behind inferd_instance_utilization and inferd_capacity_ratio, on a clock
the test moves (the integration test drives a real server: test_load_signal.py)."""

from __future__ import annotations

from inferd.scheduling.load_signal import IDLE, WINDOW_S, LoadWindow

S = 1_000_000_000  # ns


class Clock:
    def __init__(self) -> None:
        self.now = 1000 * S

    def __call__(self) -> int:
        return self.now


def test_never_used_is_idle() -> None:
    window = LoadWindow(2, clock=Clock())
    assert window.sample() == IDLE
    assert window.sample().utilization == 0.0 and window.sample().capacity_ratio == 0.0


def test_idle_after_a_request_falls_towards_zero() -> None:
    clock = Clock()
    window = LoadWindow(1, clock=clock)
    window.arrived(1)
    window.started(0, clock.now)
    window.finished(0, clock.now, clock.now + S // 100, 1)  # 10 ms of work
    clock.now += 20 * S
    sample = window.sample()
    assert 0 < sample.utilization < 0.01
    assert 0 < sample.capacity_ratio < 0.01


def test_saturated_instances_read_one_and_overload_reads_above_one() -> None:
    """One instance executing back to back, 10 ms a row, while twice as many rows arrive
    as it can serve: utilization 1, demand twice the capacity."""
    clock = Clock()
    window = LoadWindow(1, clock=clock)
    for _ in range(200):  # 2 s of batches of 1 row, 10 ms each
        window.arrived(1)
        window.arrived(1)  # the second one queues (or is shed): demand all the same
        window.started(0, clock.now)
        window.finished(0, clock.now, clock.now + S // 100, 1)
        clock.now += S // 100
    sample = window.sample()
    assert sample.utilization > 0.99
    assert 1.9 < sample.capacity_ratio < 2.1


def test_a_long_running_execution_counts_while_it_runs() -> None:
    """A batch that has not finished is busy time already (a slow or stuck model)."""
    clock = Clock()
    window = LoadWindow(2, clock=clock)
    window.arrived(1)
    window.started(1, clock.now)
    clock.now += 5 * S
    sample = window.sample()
    assert 0.49 < sample.utilization <= 0.5  # one of two instances, all the time
    assert sample.capacity_ratio == sample.utilization  # no cost per row known yet


def test_only_the_recent_window_counts() -> None:
    clock = Clock()
    window = LoadWindow(1, clock=clock)
    window.arrived(1)
    window.started(0, clock.now)
    window.finished(0, clock.now, clock.now + 10 * S, 1)  # busy 10 s
    clock.now += 10 * S
    assert window.sample().utilization > 0.99
    clock.now += 2 * WINDOW_S * S  # two windows of nothing
    assert window.sample().utilization == 0.0
    assert window.sample().capacity_ratio == 0.0


def test_samples_add_up_across_versions() -> None:
    clock = Clock()
    busy, idle = LoadWindow(1, clock=clock), LoadWindow(1, clock=clock)
    busy.arrived(1)
    idle.arrived(1)
    busy.started(0, clock.now)
    clock.now += 4 * S
    total = busy.sample() + idle.sample()
    assert 0.49 < total.utilization <= 0.5
