"""Crash isolation: a Python model running in a process of its own.

Config `parameters { key: "isolation" value: { string_value: "process" } }` makes
`PythonBackend.load` return a `ProcessInstance` (inferd's `Model`) or a `TritonProcessInstance` (a
`TritonPythonModel`, which takes the batch's requests one by one, as in the server process). Each
starts a child process (pipe.py) that imports `model.py`, builds the model, calls its
`load(context)` / `initialize(args)`, then answers batches (child.py).

When the child dies (segfault, `os._exit`, OOM kill, SIGKILL), the batch it was executing fails
with a `MODEL_ERROR` naming the crash, and a new child is started in the background, loading the
model again; the next batch waits for it. If that restart fails, every later batch fails with
`UNAVAILABLE` and the reason, and `is_alive()` stays False. A child that dies while loading
(rather than raising) is started again with backoff, a few times, before the load fails
(pipe.start_model_process). An execution that hangs past the model's execution timeout is
ended by `kill_process`: the child is killed and replaced like one that crashed.

Whatever the child logs or prints (prints become records of `inferd.model.<name>`, as in the
server) is sent over a second pipe and re-emitted by the parent's logging, tagged with the model.

Messages on the main pipe, parent → child: `("execute", inputs, infos)` (infos: None, or a
`RequestInfo` per request when the model's predict takes them), `("execute_requests",
[(inputs, rows, output names, request id, parameters, timeout µs, correlation id, flags)])`
(a TritonPythonModel), `("stop",)`; child → parent: `("ready", info)` or `("load_failed",
reason)` once, then `("ok", outputs | results)` or `("error", message)` per batch, and
`("stopped", unload_error | None)` at the end; in between, the child's pb_utils calls
(pipe.py). A decoupled `Model` streams instead (parent_stream.py): `("stream", ...)`
per request, answered by its `("response", ...)` messages and `("done", error | None)`; the
parent raises a shared flag when the request's client has gone. `auto_complete_in_process`
runs a child whose only answer is `("completed", config JSON | None)` or `("load_failed",
reason)`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.backends.python.bls_request import current_callers
from inferd.backends.python.isolated.execution_env import env_for
from inferd.backends.python.isolated.pipe import (
    STOP_TIMEOUT_S,
    ModelProcess,
    ModelProcessDiedError,
    start_model_process,
)
from inferd.backends.python.isolated.process_spec import ProcessSpec
from inferd.backends.python.model_api import RequestInfo
from inferd.backends.python.model_code import READY_TIMEOUT_S, ReadinessCheck
from inferd.backends.python.pb_utils.host import InstanceModelHost
from inferd.config.model_config import ConfigError
from inferd.errors import ErrorKind, InferdError
from inferd.tensors.conformance import OutputMismatchError
from inferd.tensors.signature import BoundRequest
from inferd.types import Array, RequestFields

log = logging.getLogger("inferd.backends.python")


def auto_complete_in_process(config: mc.ModelConfig, version_dir: Path) -> str | None:
    """TritonPythonModel.auto_complete_config's config, run in a short-lived worker process
    (importing model.py could crash the server too); None when model.py defines none."""
    ctx = LoadContext(config.name, version_dir.name, version_dir, config, 0, 1)
    spec = ProcessSpec.from_context(ctx, "auto_complete", env_for(config, version_dir))
    worker = ModelProcess(spec, lambda _: None)
    try:
        message = worker.receive()
    except ModelProcessDiedError as exc:
        raise ConfigError(
            f"{config.name}/{version_dir.name}/model.py: the worker process running "
            f"auto_complete_config died ({exc})"
        ) from None
    finally:
        worker.stopping = True
        worker.reap()
    if message[0] != "completed":
        raise ConfigError(str(message[1]))
    completed: str | None = message[1]
    return completed


class ProcessInstance:
    """A model in its own worker process; an `Instance` and a `SupervisedInstance` (and a
    `RequestInfoInstance` when its `predict` takes the requests)."""

    device = "cpu"
    provider = "python-process"

    def __init__(
        self,
        ctx: LoadContext,
        spec: ProcessSpec,
        host: InstanceModelHost | None,
        worker: ModelProcess,
        info: dict[str, Any],
    ) -> None:
        self._spec = spec
        self._name = ctx.model_name
        self._host = host
        self._api = info["api"]
        self.wants_request_info: bool = info["wants_request_info"]  # predict takes them
        self._lock = threading.Lock()
        self._closed = False
        self._restarting: threading.Event | None = None
        self._failure: str | None = None  # why the last restart failed
        self.restarts = 0  # how many times a dead worker was replaced
        self.execution_started: float | None = None  # see ReplaceableInstance
        # The first worker started before this object existed: its exit comes here from now
        # on (a death before this line is found by the next batch, as a death while idle).
        worker.on_exit = self._on_process_exit
        self._worker: ModelProcess | None = worker

    def _start(self) -> ModelProcess:
        worker, info = start_model_process(self._spec, self._on_process_exit, self._host)
        if info["api"] != self._api:
            worker.stop()
            raise RuntimeError(
                f"model.py now defines a {info['api']} model instead of a {self._api} one; "
                "reload the model"
            )
        return worker

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

    def execute_with_requests(
        self, inputs: dict[str, Array], requests: Sequence[RequestFields]
    ) -> dict[str, Array]:
        return self.execute_with_info(inputs, [RequestInfo.of(r) for r in requests])

    def execute_with_info(
        self, inputs: dict[str, Array], requests: list[RequestInfo] | None
    ) -> dict[str, Array]:
        message = self._exchange(("execute", inputs, requests))
        outputs: dict[str, Array] = message[1]
        return outputs

    def _exchange(
        self,
        request: tuple[Any, ...],
        on_poll: Callable[[ModelProcess], None] | None = None,
        before: Callable[[ModelProcess], None] | None = None,
    ) -> tuple[Any, ...]:
        """Send one batch and wait for its answer; a dead worker fails it and restarts.
        `before(worker)` runs before the send, `on_poll(worker)` while it waits."""
        worker = self._ready_process()
        if before is not None:
            before(worker)
        worker.bls.callers = current_callers()  # the model's BLS calls are made for them
        try:
            worker.send(request)
            message = worker.receive(on_poll=None if on_poll is None else lambda: on_poll(worker))
        except ModelProcessDiedError as exc:
            self._begin_restart(worker)
            raise InferdError(
                ErrorKind.MODEL_ERROR,
                f"the model's worker process died ({exc}) while executing this batch; "
                "it is being restarted",
            ) from None
        finally:
            worker.bls.callers = ()
        if message[0] != "ok":
            raise InferdError(ErrorKind.MODEL_ERROR, str(message[1]))
        return message

    def _ready_process(self) -> ModelProcess:
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

    def _on_process_exit(self, worker: ModelProcess) -> None:
        self._begin_restart(worker)

    def kill_process(self, reason: str) -> None:
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

    def _begin_restart(self, dead: ModelProcess) -> None:
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

    def _restart(self, dead: ModelProcess, done: threading.Event) -> None:
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
        """Stop the worker: it runs the model's `unload()` / `finalize()` and exits; killed
        if it hangs."""
        with self._lock:
            self._closed = True
            worker, pending = self._worker, self._restarting
            self._worker = None
        try:
            if pending is not None:
                # The restart thread stops what it started once it sees the instance closed.
                pending.wait(STOP_TIMEOUT_S)
            if worker is not None:
                unload_error = worker.stop()
                if unload_error is not None:
                    raise RuntimeError(f"unload() failed: {unload_error}")
        finally:
            if self._host is not None:
                self._host.close()


class TritonProcessInstance(ProcessInstance):
    """A `TritonPythonModel` in its own worker process: a `RequestListInstance`, whose
    `is_alive()` also reports the model's `is_ready()` (asked of the worker's readiness
    thread, so a probe does not wait for a batch)."""

    def __init__(
        self,
        ctx: LoadContext,
        spec: ProcessSpec,
        host: InstanceModelHost | None,
        worker: ModelProcess,
        info: dict[str, Any],
    ) -> None:
        super().__init__(ctx, spec, host, worker, info)
        self._readiness: ReadinessCheck | None = None
        if info["is_ready"]:
            self._readiness = ReadinessCheck(f"inferd-model-{ctx.model_name}", self._ask_ready)

    def _ask_ready(self) -> bool:
        worker = self._worker
        return worker is not None and worker.ask_ready(READY_TIMEOUT_S)

    def is_alive(self) -> bool:
        if not super().is_alive():
            return False
        return self._readiness is None or self._readiness.ready()

    def execute_requests(
        self, requests: list[BoundRequest]
    ) -> list[dict[str, Array] | InferdError]:
        def clear_flags(worker: ModelProcess) -> None:
            worker.cancelled[:] = [0] * len(worker.cancelled)

        def mark_cancelled(worker: ModelProcess) -> None:
            for i, request in enumerate(requests[: len(worker.cancelled)]):
                if request.is_cancelled is not None and request.is_cancelled():
                    worker.cancelled[i] = 1

        message = self._exchange(
            (
                "execute_requests",
                [
                    (
                        r.inputs,
                        r.rows,
                        r.output_names,
                        r.request_id,
                        r.parameters,
                        r.timeout_us,
                        r.correlation_id,
                        r.flags,
                    )
                    for r in requests
                ],
            ),
            on_poll=mark_cancelled,
            before=clear_flags,
        )
        results: list[dict[str, Array] | InferdError] = []
        for request, (kind, *rest) in zip(requests, message[1], strict=True):
            if kind == "outputs":
                outputs, request.response_parameters = rest
                results.append(outputs)
            else:
                error_kind, text, mismatch, _ = rest
                results.append(
                    OutputMismatchError(text)
                    if mismatch
                    else InferdError(ErrorKind(error_kind), text)
                )
        return results

    def close(self) -> None:
        if self._readiness is not None:
            self._readiness.close()
        super().close()
