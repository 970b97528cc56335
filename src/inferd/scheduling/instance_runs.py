"""One execution handed to an instance's thread, and the register of those still running.

`run_in_executor` would do the hand-over, but its future cannot say when the thread is done
once the awaiting side has stopped waiting (a timeout, a cancelled task): a `Call` is filled
by the thread itself, which then wakes the loop, and it is registered in `RUNNING` from the
moment it is created until the thread leaves it, whoever still awaits it. A shutdown that
cannot finish reports what is there and exits rather than wait at interpreter exit for
threads that may never return (server/shutdown.py). The execution timeout is a plain timer on the
same wake-up future: on the hot path it costs one `call_later` and its cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from inferd.telemetry.snapshots import items

T = TypeVar("T")

# id(call) -> (model, version, instance index, started on the monotonic clock). Written on
# the loop and by executor threads (single dict operations); read through snapshots.
RUNNING: dict[int, tuple[str, str, int, float]] = {}


def running_executions() -> list[str]:
    """What is executing now, longest first: "model 'm' version 1 instance 0 for 12.3 s"."""
    now = time.monotonic()
    calls = sorted(items(RUNNING), key=lambda kv: kv[1][3])
    return [
        f"model '{name}' version {version} instance {index} for {now - started:.1f} s"
        for _, (name, version, index, started) in calls
    ]


def wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class InstanceRun(Generic[T]):
    """`run` executes in a thread; the loop awaits `woken`, then reads `returned`."""

    __slots__ = ("_error", "_loop", "_outcome", "on_return", "returned", "started", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop, what: tuple[str, str, int]) -> None:
        self._loop = loop
        # Set when the call returns, or by a timer: a fresh one for each wait.
        self.woken: asyncio.Future[None] = loop.create_future()
        self.returned = False
        self._outcome: T | None = None
        self._error: BaseException | None = None
        self.on_return: Callable[[], None] | None = None  # on the loop, once it has returned
        self.started = time.monotonic()
        RUNNING[id(self)] = (*what, self.started)

    def run(self, function: Callable[..., T], *args: Any) -> None:
        """In the executor thread."""
        try:
            self._outcome = function(*args)
        except BaseException as exc:
            self._error = exc
        finally:
            RUNNING.pop(id(self), None)
            # A closed loop (RuntimeError): the process is ending, nobody waits any more.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._has_returned)

    def _has_returned(self) -> None:
        self.returned = True
        wake(self.woken)
        if self.on_return is not None:
            self.on_return()

    def result(self) -> T:
        """What the function returned; raises what it raised. Only once `returned`."""
        if self._error is not None:
            raise self._error
        return self._outcome  # type: ignore[return-value]
