"""Crash isolation: a Python `Model` running in its own worker process.

Config `parameters { key: "isolation" value: { string_value: "process" } }` makes
`PythonBackend.load` return a `ProcessInstance`. It starts a child process (multiprocessing's
"spawn" context: the server has threads, so it never forks) that imports `model.py`, builds the
`Model`, calls `load(context)`, then answers batches sent over a `multiprocessing.Pipe`.

When the child dies (segfault, `os._exit`, OOM kill, SIGKILL), the batch it was executing fails
with a `MODEL_ERROR` naming the crash, and a new child is started in the background, loading the
model again; the next batch waits for it. If that restart fails, every later batch fails with
`UNAVAILABLE` and the reason, and `is_alive()` stays False. A child that dies while loading
(rather than raising) is started again with backoff, a few times, before the load fails. An
execution that hangs past the model's execution timeout is ended by `kill_worker`: the child
is killed and replaced like one that crashed.

Whatever the child logs or prints (prints become records of `inferd.model.<name>`, as in the
server) is sent over a second pipe and re-emitted by the parent's logging, tagged with the model.

Messages on the main pipe, parent → child: `("execute", inputs, infos)` (infos: None, or
a `RequestInfo` per request when the model's predict takes them), `("stop",)`;
child → parent: `("ready", wants_request_info)` or `("load_failed", reason)` once, then
`("ok", outputs)` or `("error", message)` per batch, and `("stopped", unload_error | None)`
at the end. A decoupled model streams instead (worker_stream.py): `("stream", ...)` per
request, answered by its `("response", ...)` messages and `("done", error | None)`; the
parent raises a shared flag when the request's client has gone.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.errors import ErrorKind, InferdError
from inferd.python_model import RequestInfo
from inferd.types import Array

log = logging.getLogger("inferd.backends.python")

_POLL_S = 0.1  # how often a waiting parent checks that the child is still alive
# A worker that dies while loading (rather than raising) is started again, this many times in
# all, the first retry after _LOAD_BACKOFF_S and each further one after twice as long.
_LOAD_ATTEMPTS = 3
_LOAD_BACKOFF_S = 0.5
_STOP_TIMEOUT_S = 30.0  # how long close() waits for unload() before terminating the child
_REAP_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything the child needs to load the model; picklable."""

    model_name: str
    version: str
    version_dir: Path
    config: bytes  # the ModelConfig, serialized
    instance_index: int
    instance_count: int
    log_level: int  # the parent's root level: records below it are not sent

    @classmethod
    def from_context(cls, ctx: LoadContext) -> WorkerSpec:
        return cls(
            ctx.model_name,
            ctx.version,
            ctx.version_dir,
            ctx.config.SerializeToString(),
            ctx.instance_index,
            ctx.instance_count,
            logging.getLogger().getEffectiveLevel(),
        )

    def load_context(self) -> LoadContext:
        config = mc.ModelConfig()
        config.ParseFromString(self.config)
        return LoadContext(
            self.model_name,
            self.version,
            self.version_dir,
            config,
            self.instance_index,
            self.instance_count,
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


class WorkerDiedError(Exception):
    """The child died; `str()` describes how (`exit code 1`, `killed by signal SIGSEGV`)."""


class DiedLoadingError(RuntimeError):
    """The child died while loading the model (it did not report a load error)."""


# -- the parent's side of one child -----------------------------------------------------------


class _Worker:
    """One child process, its pipes and the thread relaying its log records."""

    def __init__(self, spec: WorkerSpec, on_exit: Callable[[_Worker], None]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        log_read, log_write = ctx.Pipe(duplex=False)
        # Shared with the child: 1 while the client of the request it streams has gone.
        self.cancelled: Any = ctx.Value("b", 0, lock=False)
        # Daemonic: if the server exits without closing the instance, multiprocessing
        # terminates the child instead of waiting for it.
        self.process: BaseProcess = ctx.Process(
            target=worker_main,
            args=(child_conn, log_write, spec, self.cancelled),
            name=f"inferd-model-{spec.model_name}-{spec.instance_index}",
            daemon=True,
        )
        self._reap_lock = threading.Lock()
        self.stopping = False
        self.process.start()
        # Our copies of the child's ends: closed, so that the child's death reads as EOF.
        child_conn.close()
        log_write.close()
        self._relay = threading.Thread(
            target=self._relay_logs,
            args=(log_read, spec.model_name, on_exit),
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

    def _relay_logs(self, conn: Connection, model: str, on_exit: Callable[[_Worker], None]) -> None:
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
                on_exit(self)
            except Exception:  # the relay's last act: never let it die unlogged
                log.exception("model %s: handling its worker process's exit failed", model)

    def send(self, message: tuple[Any, ...]) -> None:
        """Pickle, then send; raises WorkerDiedError when the child is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._conn.send_bytes(data)
        except OSError:
            raise WorkerDiedError(self.exit_description()) from None

    def receive(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The child's next message; raises WorkerDiedError when it dies first, TimeoutError
        after `timeout` seconds (None: wait as long as the child lives)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                ready = self._conn.poll(_POLL_S)
            except (EOFError, OSError):
                raise WorkerDiedError(self.exit_description()) from None
            if ready:
                try:
                    message: tuple[Any, ...] = self._conn.recv()
                except (EOFError, OSError):
                    raise WorkerDiedError(self.exit_description()) from None
                return message
            if not self.is_alive():
                # Anything it sent before dying would have made poll() true: it is gone.
                # (A restart thread may have closed the pipe already: OSError.)
                try:
                    if self._conn.poll(0):
                        continue
                except (EOFError, OSError):
                    pass
                raise WorkerDiedError(self.exit_description())
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError

    def wait_ready(self) -> bool:
        """Wait for the child's load; raises RuntimeError with the reason when it fails.
        Returns whether the model's `predict` takes the requests' infos."""
        try:
            message = self.receive()
        except WorkerDiedError as exc:
            self.stop()
            raise DiedLoadingError(
                f"the model's worker process died ({exc}) while loading the model"
            ) from None
        if message[0] != "ready":
            self.stop()
            raise RuntimeError(str(message[1]))
        return bool(message[1])

    def stop(self) -> str | None:
        """Ask the child to unload and exit; terminate or kill it if it does not.
        Returns unload()'s error message, if it raised."""
        self.stopping = True
        unload_error: str | None = None
        if self.is_alive():
            try:
                self.send(("stop",))
                deadline = time.monotonic() + _STOP_TIMEOUT_S
                while True:
                    message = self.receive(timeout=max(0.0, deadline - time.monotonic()))
                    if message[0] == "stopped":
                        unload_error = message[1]
                        break
            except (WorkerDiedError, TimeoutError):
                pass
        self.reap()
        self._conn.close()
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


# -- the instance the batcher sees -------------------------------------------------------------


class ProcessInstance:
    """A `Model` in its own worker process; an `Instance` and a `SupervisedInstance`."""

    device = "cpu"
    provider = "python-process"

    def __init__(self, ctx: LoadContext) -> None:
        self._spec = WorkerSpec.from_context(ctx)
        self._name = ctx.model_name
        self._lock = threading.Lock()
        self._closed = False
        self._restarting: threading.Event | None = None
        self._failure: str | None = None  # why the last restart failed
        self.restarts = 0  # how many times a dead worker was replaced
        self.wants_request_info = False  # the child's predict takes the requests' infos
        self.execution_started: float | None = None  # see ReplaceableInstance
        # Set before the first worker starts: its log relay may report its exit (a death
        # while loading) before _start returns.
        self._worker: _Worker | None = None
        self._worker = self._start()

    def _start(self) -> _Worker:
        """Start a worker and wait for its load. One that dies while loading is started
        again, with backoff, up to _LOAD_ATTEMPTS times; one whose load raises is not (it
        would raise again)."""
        attempt, delay = 1, _LOAD_BACKOFF_S
        while True:
            worker = _Worker(self._spec, self._on_worker_exit)
            try:
                self.wants_request_info = worker.wait_ready()
                return worker
            except DiedLoadingError as exc:
                if attempt >= _LOAD_ATTEMPTS or self._closed:
                    raise DiedLoadingError(
                        f"{exc}, {attempt} time{'s' if attempt > 1 else ''} in a row; gave up"
                    ) from None
                log.warning(
                    "model %s: %s; starting it again in %.1f s (attempt %d of %d)",
                    self._name,
                    exc,
                    delay,
                    attempt + 1,
                    _LOAD_ATTEMPTS,
                    extra={"model": self._name},
                )
            time.sleep(delay)  # a loader or restart thread, never the event loop
            attempt, delay = attempt + 1, delay * 2

    @property
    def pid(self) -> int | None:
        """The current worker process's id (None while it is being restarted)."""
        worker = self._worker
        return worker.pid if worker is not None else None

    def is_alive(self) -> bool:
        """False while the worker process is dead and not yet restarted (or failed to)."""
        worker = self._worker
        return worker is not None and not self._closed and worker.is_alive()

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        return self.execute_with_info(inputs, None)

    def execute_with_info(
        self, inputs: dict[str, Array], requests: list[RequestInfo] | None
    ) -> dict[str, Array]:
        worker = self._ready_worker()
        try:
            worker.send(("execute", inputs, requests))
            message = worker.receive()
        except WorkerDiedError as exc:
            self._begin_restart(worker)
            raise InferdError(
                ErrorKind.MODEL_ERROR,
                f"the model's worker process died ({exc}) while executing this batch; "
                "it is being restarted",
            ) from None
        if message[0] == "ok":
            outputs: dict[str, Array] = message[1]
            return outputs
        raise InferdError(ErrorKind.MODEL_ERROR, str(message[1]))

    def _ready_worker(self) -> _Worker:
        """The live worker; waits for a restart in progress, starts one if the worker died
        while idle, raises UNAVAILABLE when the instance cannot serve."""
        while True:
            with self._lock:
                if self._closed:
                    raise InferdError(ErrorKind.UNAVAILABLE, "the model instance is closed")
                worker, pending, failure = self._worker, self._restarting, self._failure
            if pending is not None:
                self.execution_started = None  # waiting for a worker is not execution
                pending.wait()
                continue
            if worker is None:
                raise InferdError(
                    ErrorKind.UNAVAILABLE,
                    "the model's worker process died and could not be restarted: "
                    f"{failure}; reload the model to try again",
                )
            if not worker.is_alive():
                self._begin_restart(worker)
                continue
            # Every execution gets its worker here: the execution timeout counts from now.
            self.execution_started = time.monotonic()
            return worker

    def _on_worker_exit(self, worker: _Worker) -> None:
        self._begin_restart(worker)

    def kill_worker(self, reason: str) -> None:
        """End a hung execution: kill the worker process; the executing thread then fails
        and a new worker is started (as after a crash)."""
        worker = self._worker
        if worker is None or self._closed:
            return
        log.warning(
            "model %s: killing its worker process (pid %s): %s",
            self._name,
            worker.pid,
            reason,
            extra={"model": self._name},
        )
        worker.process.kill()

    def _begin_restart(self, dead: _Worker) -> None:
        """Replace `dead` by a new worker, in the background; once per dead worker."""
        with self._lock:
            if self._closed or self._worker is not dead:
                return
            self._worker = None
            self.restarts += 1
            done = threading.Event()
            self._restarting = done
        log.warning(
            "model %s: its worker process (pid %s) died (%s); restarting it (restart %d)",
            self._name,
            dead.pid,
            dead.exit_description(),
            self.restarts,
            extra={"model": self._name},
        )
        threading.Thread(
            target=self._restart,
            args=(dead, done),
            name=f"inferd-model-restart-{self._name}",
            daemon=True,
        ).start()

    def _restart(self, dead: _Worker, done: threading.Event) -> None:
        try:
            dead.reap()
            worker = self._start()
        except Exception as exc:
            log.error(
                "model %s: restarting its worker process failed: %s",
                self._name,
                exc,
                extra={"model": self._name},
            )
            with self._lock:
                self._failure = str(exc)
                self._restarting = None
        else:
            with self._lock:
                closed = self._closed
                if not closed:
                    self._worker = worker
                    self._failure = None
                self._restarting = None
            if closed:
                worker.stop()
        finally:
            done.set()

    def close(self) -> None:
        """Stop the worker: it runs the model's `unload()` and exits; killed if it hangs."""
        with self._lock:
            self._closed = True
            worker, pending = self._worker, self._restarting
            self._worker = None
        if pending is not None:
            # The restart thread stops what it started once it sees the instance closed.
            pending.wait(_STOP_TIMEOUT_S)
        if worker is not None:
            unload_error = worker.stop()
            if unload_error is not None:
                raise RuntimeError(f"unload() failed: {unload_error}")


# -- the child ---------------------------------------------------------------------------------


class _PipeLogHandler(logging.Handler):
    """Sends each record, formatted, to the parent (`Handler.handle` serialises the sends)."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self._conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self._conn.send((record.name, record.levelno, message))
        except Exception:
            self.handleError(record)


def worker_main(conn: Connection, log_conn: Connection, spec: WorkerSpec, cancelled: Any) -> None:
    """The child process: load the model, then answer batches until told to stop."""
    # Imported here: python.py and worker_stream.py import this module.
    from inferd import model_output
    from inferd.backends.python import PythonInstance, StreamingPythonInstance, import_model_module
    from inferd.backends.worker_stream import PipeSender, serve_stream

    faulthandler.enable()  # a segfault's traceback goes to the inherited stderr
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_PipeLogHandler(log_conn))
    root.setLevel(spec.log_level)
    # Prints are always sent: the parent's logger levels decide whether they are kept.
    logging.getLogger("inferd.model").setLevel(logging.DEBUG)
    model_output.install()

    ctx = spec.load_context()
    try:
        module = import_model_module(ctx)
        if not hasattr(module, "Model"):
            raise RuntimeError(
                "model.py defines no class 'Model': isolation \"process\" runs inferd's "
                "Model API only (a TritonPythonModel runs in the server process)"
            )
        if ctx.config.model_transaction_policy.decoupled:
            instance: PythonInstance = StreamingPythonInstance(ctx, module)
        else:
            instance = PythonInstance(ctx, module)
    except Exception as exc:
        conn.send(("load_failed", str(exc) or type(exc).__name__))
        return
    conn.send(("ready", instance.wants_request_info))
    # A decoupled model may send from threads of its own: every send takes the pipe in turn.
    pipe = PipeSender(conn)

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the server is gone
            break
        if message[0] == "execute":
            try:
                inputs, infos = message[1], message[2]
                outputs = (
                    instance.execute(inputs)
                    if infos is None
                    else instance.execute_with_info(inputs, infos)
                )
                data = pickle.dumps(("ok", outputs), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                data = pickle.dumps(("error", str(exc) or type(exc).__name__))
            pipe.send_bytes(data)
        elif message[0] == "stream":
            assert isinstance(instance, StreamingPythonInstance)
            serve_stream(instance, message, pipe, cancelled)
        elif message[0] == "stop":
            unload_error = None
            try:
                instance.close()
            except Exception as exc:
                unload_error = str(exc) or type(exc).__name__
            pipe.send_bytes(pickle.dumps(("stopped", unload_error)))
            break
