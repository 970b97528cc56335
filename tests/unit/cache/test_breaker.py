"""The Redis breaker: opens after FAILURES failures in a row, lets one probe through per
open_s, closes on the probe's success; cancelled probes do not wedge it."""

from __future__ import annotations

from inferd.cache.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_failures_in_a_row_only():
    breaker = Breaker(failures=3, open_s=5, clock=Clock())
    breaker.failed()
    breaker.failed()
    breaker.succeeded()  # the run is broken
    breaker.failed()
    breaker.failed()
    assert breaker.allow() and not breaker.is_open
    breaker.failed()
    assert breaker.is_open and not breaker.allow() and breaker.opens == 1


def test_one_probe_per_open_period_and_its_outcome_decides():
    clock = Clock()
    breaker = Breaker(failures=1, open_s=5, clock=clock)
    breaker.failed()
    clock.now = 4.9
    assert not breaker.allow()
    clock.now = 5.0
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # ...and only one
    breaker.failed()  # it failed: open again, for another open_s
    assert breaker.opens == 2 and not breaker.allow()
    clock.now = 10.0
    assert breaker.allow()
    breaker.succeeded()
    assert not breaker.is_open and breaker.allow() and breaker.allow()


def test_an_abandoned_probe_lets_the_next_call_probe():
    clock = Clock()
    breaker = Breaker(failures=1, open_s=5, clock=clock)
    breaker.failed()
    clock.now = 5
    assert breaker.allow()
    breaker.abandoned()
    assert breaker.allow()


def test_calls_in_flight_together_fail_as_one():
    """A stall of this process times out every pending call at once: one failure. Calls
    sent after a failure are new evidence and count, as before."""
    clock = Clock()
    breaker = Breaker(failures=3, open_s=5, clock=clock)
    started = [clock() + n * 0.001 for n in range(5)]  # five calls in flight
    clock.now = 1.0
    for began in started:  # ...all time out together
        breaker.failed(began)
    assert breaker.consecutive == 1 and not breaker.is_open
    clock.now = 2.0
    breaker.failed(1.5)  # sent after that failure: the second in a row
    breaker.failed(1.6)  # in flight with it: not counted
    assert breaker.consecutive == 2 and not breaker.is_open
    clock.now = 3.0
    breaker.failed(2.5)
    assert breaker.is_open and breaker.opens == 1


def test_refusing_asks_without_taking_the_probe():
    clock = Clock()
    breaker = Breaker(failures=1, open_s=5, clock=clock)
    assert not breaker.refusing()
    breaker.failed()
    assert breaker.refusing()
    clock.now = 5
    assert not breaker.refusing() and not breaker.refusing()  # the probe is due, untaken
    assert breaker.allow()  # taken
    assert breaker.refusing() and not breaker.allow()
