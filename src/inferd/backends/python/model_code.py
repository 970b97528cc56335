"""How a Python model instance's own code is called, off the server's event loop.

- `ModelLoop`: an asyncio loop in a thread of the instance's own, where the coroutines its
  methods return run (`async def execute`, as Triton's python_backend runs them: on a loop
  owned by the instance, never the server's). The caller's thread waits for the result, so
  one execution still occupies the instance, as with a plain `def`.
- `ReadinessCheck`: Triton's `is_ready()`, asked on each readiness probe without blocking the
  probe: a probe reads the latest answer and starts a new check unless one is running; a
  check running past `READY_TIMEOUT_S` reads as not ready (Triton's five seconds).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

log = logging.getLogger("inferd.backends.python")

READY_TIMEOUT_S = 5.0
_CLOSE_TIMEOUT_S = 30.0


class ModelLoop:
    def __init__(self, name: str, marks: Callable[[], AbstractContextManager[None]]) -> None:
        self._name = name
        self._marks = marks  # marks the loop's thread as running the model's code
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def resolve(self, result: Any) -> Any:
        """`result` itself, or, when a model method returned a coroutine, what it returns."""
        if not asyncio.iscoroutine(result):
            return result
        return asyncio.run_coroutine_threadsafe(result, self._running_loop()).result()

    def submit(self, coroutine: Any, on_error: Callable[[BaseException], None]) -> None:
        """Run `coroutine` on the loop without waiting for it; `on_error(exc)` if it raises."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())

        def done(f: concurrent.futures.Future[Any]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                log.error("%s: a coroutine of the model raised: %s", self._name, exc)
                on_error(exc)

        future.add_done_callback(done)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()
                thread = threading.Thread(
                    target=self._run, args=(loop, started), name=self._name, daemon=True
                )
                thread.start()
                started.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        with self._marks():
            loop.call_soon(started.set)
            loop.run_forever()
            # Stopped (the instance closes): let the tasks the model left behind unwind.
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_TIMEOUT_S)
        if thread.is_alive():
            log.warning("%s: the model's event loop did not stop within 30 s", self._name)


class ReadinessCheck:
    def __init__(self, name: str, check: Callable[[], bool]) -> None:
        self._name = name
        self._check = check
        self._closed = False
        self._pending: concurrent.futures.Future[bool] | None = None
        self._started = 0.0
        self.latest = self._answer(check)  # asked once at load, before the first probe

    def _answer(self, check: Callable[[], bool]) -> bool:
        try:
            answer = check()
        except Exception as exc:
            log.warning("%s: is_ready() raised, reading as not ready: %s", self._name, exc)
            return False
        if not isinstance(answer, bool):
            log.warning(
                "%s: is_ready() returned %s, not a bool: reading as not ready",
                self._name,
                type(answer).__name__,
            )
            return False
        return answer

    def ready(self) -> bool:
        """The latest answer; starts the next check. Cheap: called on the event loop."""
        pending = self._pending
        if pending is not None and not pending.done():
            if time.monotonic() - self._started > READY_TIMEOUT_S:
                return False
            return self.latest
        if pending is not None:
            self.latest = pending.result()
        if not self._closed:
            # A daemon thread per check: one that hangs must not hold up unload or exit.
            future: concurrent.futures.Future[bool] = concurrent.futures.Future()
            self._pending, self._started = future, time.monotonic()
            threading.Thread(
                target=lambda: future.set_result(self._answer(self._check)),
                name=f"{self._name}-is-ready",
                daemon=True,
            ).start()
        return self.latest

    def close(self) -> None:
        self._closed = True
