"""The parent's end of one Python-model worker process: start it, talk to it, reap it.

A `ModelProcess` owns the child process (multiprocessing's "spawn" context: the server has
threads, so it never forks) and its pipes:

- the main pipe, both ways: the parent's requests, the child's answers, and in between the
  child's `("call", method, args)` for the pb_utils calls that need the server, which
  `receive` answers with the instance's host while it waits (`("reply", value)` or
  `("raise", message)`); `inferd.shared_array`'s open is answered with the segment's
  descriptor too, passed on this socket (SCM_RIGHTS);
- the log pipe, child → parent: records re-emitted by the parent's logging;
- the readiness pipe: `(question id,)` → `(question id, answer)` for `is_ready()`, answered
  by a thread of the child while its main thread may be executing;
- the BLS pipe: the model's calls to other models, answered by id, many at once
  (parent_bls.py);
- `cancelled`: one shared flag per request of the batch executing, set by the parent when a
  client gives up, read by `request.is_cancelled()` in the child.

The message protocol itself is in isolated_instance.py (parent) and child.py (child).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import multiprocessing.sharedctypes  # noqa: F401  (imported up front: see below)
import multiprocessing.spawn
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import send_handle
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.python.isolated.child import child_main  # the child's side
from inferd.backends.python.isolated.parent_bls import BlsServer
from inferd.backends.python.isolated.process_spec import ProcessSpec
from inferd.backends.python.pb_utils.host import InstanceModelHost, MetricKind
from inferd.backends.python.pb_utils.triton_errors import TritonModelException
from inferd.backends.python.shared_array_store import SharedArrayError

# multiprocessing imports `sharedctypes` at the first RawArray. Versions load in threads,
# several at once: two process-isolated models' first RawArrays raced there and failed a
# load with "cannot import name 'RawArray'" (CI). Imported above, it never is first
# imported by two threads at once.

log = logging.getLogger("inferd.backends.python")
_SPAWN_LOCK = threading.Lock()  # a start with another interpreter: one at a time

_POLL_S = 0.1  # how often a waiting parent checks that the child is still alive
# A worker that dies while loading (rather than raising) is started again, this many times in
# all, the first retry after _LOAD_BACKOFF_S and each further one after twice as long.
_LOAD_ATTEMPTS = 3
_LOAD_BACKOFF_S = 0.5
STOP_TIMEOUT_S = 30.0  # how long stop() waits for unload() before terminating the child
_REAP_TIMEOUT_S = 5.0
# What a child may ask of the server (pb_utils.host.ModelHost's methods).
_HOST_CALLS = frozenset(
    {"load_model", "unload_model", "is_model_ready", "metric_family", "metric_new", "metric_op"}
)


def describe_exit(exitcode: int | None) -> str:
    """`exit code 1`, `killed by signal SIGKILL`, ..."""
    if exitcode is None:
        return "exit code unknown"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = str(-exitcode)
    return f"killed by signal {name}"


class ModelProcessDiedError(Exception):
    """The child died; `str()` describes how (`exit code 1`, `killed by signal SIGSEGV`)."""


class DiedLoadingError(RuntimeError):
    """The child died while loading the model (it did not report a load error)."""


class ModelProcess:
    """One child process, its pipes and the thread relaying its log records."""

    def __init__(
        self,
        spec: ProcessSpec,
        on_exit: Callable[[ModelProcess], None],
        host: InstanceModelHost | None = None,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.host = host  # answers the child's pb_utils calls
        self.on_exit = on_exit  # told when the child exits without being stopped
        self._conn, child_conn = ctx.Pipe(duplex=True)
        log_read, log_write = ctx.Pipe(duplex=False)
        self._ready_conn, ready_child = ctx.Pipe(duplex=True)
        bls_conn, bls_child = ctx.Pipe(duplex=True)
        self._ready_lock = threading.Lock()
        self._questions = itertools.count(1)
        # A batch holds at most max_batch_size requests (one when the model does not batch).
        config = mc.ModelConfig()
        config.ParseFromString(spec.config)
        self.cancelled: Any = ctx.RawArray("b", max(1, int(config.max_batch_size)))
        # Daemonic: if the server exits without closing the instance, multiprocessing
        # terminates the child instead of waiting for it.
        self.process: BaseProcess = ctx.Process(
            target=child_main,
            args=(child_conn, log_write, ready_child, self.cancelled, spec, bls_child),
            name=f"inferd-model-{spec.model_name}-{spec.instance_index}",
            daemon=True,
        )
        self._reap_lock = threading.Lock()
        self.stopping = False
        if spec.env_python:  # the model's own environment's interpreter (execution_env.py)
            with _SPAWN_LOCK:
                # spawn reads one interpreter for every context: set for this start alone.
                # A start elsewhere racing it would run that interpreter too, of the same
                # Python version (checked) and on the server's own sys.path (spawn's).
                server = multiprocessing.spawn.get_executable()
                ctx.set_executable(spec.env_python)
                try:
                    self.process.start()
                finally:
                    ctx.set_executable(server)
        else:
            self.process.start()
        # Our copies of the child's ends: closed, so that the child's death reads as EOF.
        child_conn.close()
        log_write.close()
        ready_child.close()
        bls_child.close()
        self.bls = BlsServer(
            bls_conn, host, f"inferd-model-{spec.model_name}-{spec.instance_index}"
        )
        self._relay = threading.Thread(
            target=self._relay_logs,
            args=(log_read, spec.model_name),
            name=f"inferd-model-log-{spec.model_name}-{spec.instance_index}",
            daemon=True,
        )
        self._relay.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def is_alive(self) -> bool:
        with self._reap_lock:
            return self.process.is_alive()

    def exit_description(self) -> str:
        """How the (dead) child ended, reaping it."""
        with self._reap_lock:
            self.process.join(_REAP_TIMEOUT_S)
            return describe_exit(self.process.exitcode)

    def _relay_logs(self, conn: Connection, model: str) -> None:
        try:
            while True:
                try:
                    name, levelno, message = conn.recv()
                except (EOFError, OSError):
                    break
                except Exception:  # a record that did not unpickle: skip it
                    continue
                logger = logging.getLogger(name)
                if logger.isEnabledFor(levelno):
                    record = logger.makeRecord(
                        name,
                        levelno,
                        "(model worker process)",
                        0,
                        message,
                        (),
                        None,
                        extra={"model": model},
                    )
                    logger.handle(record)
        finally:
            conn.close()
        # The child closed its log pipe: it has exited (or is about to).
        if not self.stopping:
            try:
                self.on_exit(self)
            except Exception:  # the relay's last act: never let it die unlogged
                log.exception("model %s: handling its worker process's exit failed", model)

    def send(self, message: tuple[Any, ...]) -> None:
        """Pickle, then send; raises ModelProcessDiedError when the child is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._conn.send_bytes(data)
        except OSError:
            raise ModelProcessDiedError(self.exit_description()) from None

    def receive(
        self, timeout: float | None = None, on_poll: Callable[[], None] | None = None
    ) -> tuple[Any, ...]:
        """The child's next answer (its pb_utils calls answered meanwhile); raises
        ModelProcessDiedError when it dies first, TimeoutError after `timeout` seconds (None: wait
        as long as the child lives). `on_poll` runs every _POLL_S while waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                ready = self._conn.poll(_POLL_S)
            except (EOFError, OSError):
                raise ModelProcessDiedError(self.exit_description()) from None
            if ready:
                try:
                    message: tuple[Any, ...] = self._conn.recv()
                except (EOFError, OSError):
                    raise ModelProcessDiedError(self.exit_description()) from None
                if message[0] == "call":
                    if message[1].startswith("shared_array_"):
                        self._answer_array_call(message[1], message[2])
                    else:
                        self.send(self._answer_call(message[1], message[2]))
                    continue
                return message
            if on_poll is not None:
                on_poll()
            if not self.is_alive():
                # Anything it sent before dying would have made poll() true: it is gone.
                # (A restart thread may have closed the pipe already: OSError.)
                try:
                    if self._conn.poll(0):
                        continue
                except (EOFError, OSError):
                    pass
                raise ModelProcessDiedError(self.exit_description())
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError

    def _answer_call(self, method: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if self.host is None or method not in _HOST_CALLS:
            return ("raise", f"pb_utils: {method} needs the inferd server the model runs in")
        if method == "metric_family":
            args = (args[0], args[1], MetricKind(args[2]))
        try:
            return ("reply", getattr(self.host, method)(*args))
        except TritonModelException as exc:
            return ("raise", exc.message())
        except Exception as exc:
            return ("raise", f"pb_utils.{method}: {exc}")

    def _answer_array_call(self, method: str, args: tuple[Any, ...]) -> None:
        """inferd.shared_array's calls; an open's answer is followed by the segment's
        descriptor, passed over the socket (SCM_RIGHTS)."""
        if self.host is None:
            self.send(("raise", "inferd.shared_array needs the inferd server the model runs in"))
            return
        try:
            if method == "shared_array_built":
                self.host.shared_array_built(*args)
                self.send(("reply", None))
                return
            name, shape, dtype = args
            role, fd = self.host.shared_array_open(name, tuple(shape), dtype)
        except SharedArrayError as exc:
            self.send(("raise", str(exc)))
            return
        try:
            self.send(("reply", role))
            send_handle(self._conn, fd, self.process.pid)
        except OSError:
            raise ModelProcessDiedError(self.exit_description()) from None
        finally:
            os.close(fd)

    def ask_ready(self, timeout: float) -> bool:
        """The model's `is_ready()` answer, asked of the child's readiness thread."""
        with self._ready_lock:
            question = next(self._questions)
            try:
                self._ready_conn.send((question,))
                deadline = time.monotonic() + timeout
                while self._ready_conn.poll(max(0.0, deadline - time.monotonic())):
                    answered, answer = self._ready_conn.recv()
                    if answered == question:  # older answers came too late: dropped
                        return bool(answer) if isinstance(answer, bool) else False
            except (EOFError, OSError):
                return False
        return False

    def wait_ready(self) -> dict[str, Any]:
        """Wait for the child's load; its report (which API, what it reads), or RuntimeError
        with the reason when the load fails."""
        try:
            message = self.receive()
        except ModelProcessDiedError as exc:
            self.stop()
            raise DiedLoadingError(
                f"the model's worker process died ({exc}) while loading the model"
            ) from None
        if message[0] != "ready":
            self.stop()
            raise RuntimeError(str(message[1]))
        info: dict[str, Any] = message[1]
        return info

    def stop(self) -> str | None:
        """Ask the child to unload and exit; terminate or kill it if it does not.
        Returns unload()'s error message, if it raised."""
        self.stopping = True
        unload_error: str | None = None
        if self.is_alive():
            try:
                self.send(("stop",))
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while True:
                    message = self.receive(timeout=max(0.0, deadline - time.monotonic()))
                    if message[0] == "stopped":
                        unload_error = message[1]
                        break
            except (ModelProcessDiedError, TimeoutError):
                pass
        self.reap()
        self._conn.close()
        self._ready_conn.close()  # (the BLS pipe closes itself once the child is gone)
        return unload_error

    def reap(self) -> None:
        """Make sure the child is gone (terminate, then kill) and its log relay finished.

        The main pipe is left open: another thread may still be reading from it; it is closed
        when the last reference goes.
        """
        self.stopping = True
        with self._reap_lock:
            self.process.join(_REAP_TIMEOUT_S)
            if self.process.exitcode is None:
                self.process.terminate()
                self.process.join(_REAP_TIMEOUT_S)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join()
        if threading.current_thread() is not self._relay:
            self._relay.join(_REAP_TIMEOUT_S)


def start_model_process(
    spec: ProcessSpec,
    on_exit: Callable[[ModelProcess], None],
    host: InstanceModelHost | None = None,
) -> tuple[ModelProcess, dict[str, Any]]:
    """Start a worker and wait for its load: the worker and its report. One that dies while
    loading is started again, with backoff, up to _LOAD_ATTEMPTS times (then
    DiedLoadingError says how it died and how often); one whose load raises is not (it would
    raise again)."""
    attempt, delay = 1, _LOAD_BACKOFF_S
    while True:
        worker = ModelProcess(spec, on_exit, host)
        try:
            return worker, worker.wait_ready()
        except DiedLoadingError as exc:
            if attempt >= _LOAD_ATTEMPTS:
                raise DiedLoadingError(
                    f"{exc}, {attempt} time{'s' if attempt > 1 else ''} in a row; gave up"
                ) from None
            log.warning(
                "model %s: %s; starting it again in %.1f s (attempt %d of %d)",
                spec.model_name,
                exc,
                delay,
                attempt + 1,
                _LOAD_ATTEMPTS,
                extra={"model": spec.model_name},
            )
        time.sleep(delay)  # a loader or restart thread, never the event loop
        attempt, delay = attempt + 1, delay * 2
