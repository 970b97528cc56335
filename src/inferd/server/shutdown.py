"""A shutdown that always ends: one deadline from the signal, and a watchdog past it.

SIGTERM (or SIGINT) starts the clock: the HTTP drain, the gRPC drain and the models' drain
share one `--exit-timeout-secs`. A model call stuck in a thread cannot be interrupted, and at
interpreter exit `concurrent.futures` joins every executor thread (its atexit hook), so one
stuck call would keep the process alive for ever after the drain. So when the drain leaves
an execution running, the server logs what is still executing, kills its model worker
processes and ends with `os._exit(EXIT_STUCK)`; and a watchdog thread does the same
`EXIT_MARGIN_S` past the deadline whatever is blocking, the event loop included.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from typing import NoReturn

from inferd.scheduling.instance_runs import running_executions

log = logging.getLogger("inferd.server")

EXIT_MARGIN_S = 5.0  # past the exit timeout, how long the watchdog lets a shutdown run
EXIT_STUCK = 1  # the status of a shutdown that had to abandon something still executing


class ShutdownClock:
    def __init__(self, exit_timeout_s: float, margin_s: float = EXIT_MARGIN_S) -> None:
        self.exit_timeout_s = exit_timeout_s
        self.margin_s = margin_s
        self.deadline: float | None = None  # time.monotonic() by which to have exited
        self.incomplete = ""  # what the drain left behind, once it has ended

    def begin(self, watchdog: bool) -> None:
        """Start the clock, once; `watchdog`: this process is ours to end (the `inferd`
        command, not a server embedded in another program or a test)."""
        if self.deadline is not None:
            return
        self.deadline = time.monotonic() + self.exit_timeout_s
        if watchdog:
            timer = threading.Timer(
                self.exit_timeout_s + self.margin_s,
                force_exit,
                (f"the shutdown did not end within --exit-timeout-secs + {self.margin_s:g} s",),
            )
            timer.name = "inferd-shutdown-watchdog"
            timer.daemon = True
            timer.start()

    def remaining_s(self) -> float:
        """Seconds left until the deadline (starting the clock, without a watchdog, if no
        signal did)."""
        self.begin(watchdog=False)
        assert self.deadline is not None
        return max(0.0, self.deadline - time.monotonic())

    def finished(self, drained: bool) -> None:
        """The drain ended: log whether it left anything executing."""
        running = running_executions()
        if drained and not running:
            log.info("shutdown complete")
            return
        self.incomplete = (
            f"the drain did not finish within --exit-timeout-secs ({self.exit_timeout_s:g} s)"
            if not drained
            else "executions past their execution timeout never returned"
        )
        log.error(
            "shutdown incomplete: %s; still executing: %s",
            self.incomplete,
            "; ".join(running) or "nothing",
        )

    def exit_if_incomplete(self) -> None:
        """After serving: end the process now if the drain left something behind (a normal
        exit would wait for the stuck threads)."""
        if self.incomplete:
            log.error("exiting with status %d rather than wait for them", EXIT_STUCK)
            _exit()
        if running_executions():
            force_exit("executions are still running after the shutdown")


def force_exit(reason: str) -> NoReturn:
    """Log what is still executing, kill the model worker processes, exit EXIT_STUCK."""
    log.error(
        "%s; exiting with status %d; still executing: %s",
        reason,
        EXIT_STUCK,
        "; ".join(running_executions()) or "nothing",
    )
    _exit()


def _exit() -> NoReturn:
    for child in multiprocessing.active_children():
        child.kill()  # os._exit skips multiprocessing's cleanup of daemonic children
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_STUCK)
