"""The shutdown watchdog (inferd.server.shutdown): past the exit timeout and its margin it ends the
process with EXIT_STUCK, whatever blocks it. Run in a child interpreter, since it calls
os._exit; here the main thread blocks for ever, and a stuck non-daemon executor thread would
also hold the interpreter at exit (concurrent.futures joins them)."""

from __future__ import annotations

import subprocess
import sys

from inferd.server.shutdown import EXIT_STUCK

CHILD = """
import logging, sys, threading
from concurrent.futures import ThreadPoolExecutor
from inferd.server.shutdown import ShutdownClock

logging.basicConfig(stream=sys.stdout, level=logging.INFO)
never = threading.Event()
ThreadPoolExecutor(1).submit(never.wait)  # joined at exit: the interpreter could not end
ShutdownClock(0.2, margin_s=0.1).begin(watchdog=True)
print("blocked", flush=True)
never.wait()
"""


def test_the_watchdog_ends_a_process_whatever_blocks_it() -> None:
    # A liveness check with a generous deadline; the watchdog fires after 0.3 s.
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_STUCK, done.stdout + done.stderr
    assert "blocked" in done.stdout
    assert "the shutdown did not end within --exit-timeout-secs + 0.1 s" in done.stdout
    assert f"exiting with status {EXIT_STUCK}" in done.stdout
