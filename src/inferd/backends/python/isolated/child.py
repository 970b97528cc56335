"""The worker process of a Python model with `isolation: "process"` (the child's side).

It imports `model.py`, builds the model (inferd's `Model` or Triton's `TritonPythonModel`),
then answers the parent's messages until told to stop (the protocol: isolated_instance.py).
A second task, `auto_complete`, only runs `TritonPythonModel.auto_complete_config` and exits:
Triton runs it in a stub process of its own too.

`pb_utils` calls that need the server (load_model, is_model_ready, custom metrics) travel
over the main pipe as `("call", method, args)` while the parent waits on that pipe, i.e.
while the model's initialize, execute or finalize runs (`PipeHost`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import faulthandler
import logging
import pickle
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any

from inferd.backends.python import model_prints
from inferd.backends.python.autocomplete import completed_config
from inferd.backends.python.bls_request import BlsCall, BlsResult
from inferd.backends.python.inferd_model import PythonInstance, StreamingPythonInstance
from inferd.backends.python.instantiate import instantiate
from inferd.backends.python.isolated.child_bls import BlsClient
from inferd.backends.python.isolated.child_stream import PipeSender, serve_stream
from inferd.backends.python.isolated.process_spec import ProcessSpec
from inferd.backends.python.model_import import import_model_module
from inferd.backends.python.pb_utils.host import MetricKind
from inferd.backends.python.pb_utils.triton_errors import TritonModelException
from inferd.backends.python.shared_array_store import ArrayScope, SharedArrayError
from inferd.backends.python.triton_model import TritonPythonInstance
from inferd.errors import InferdError
from inferd.tensors.signature import BoundRequest


class PipeHost:
    """A model's `ModelHost` in a worker process: each call is answered by the server."""

    def __init__(self, conn: Connection, pipe: PipeSender, bls: BlsClient | None = None) -> None:
        self._conn = conn
        self.pipe = pipe  # every send to the parent, from any thread, goes through it
        self._bls = bls  # calls to other models: a pipe of their own, any time, many at once
        self._lock = threading.Lock()  # model threads may call too: one exchange at a time
        self._parent_waits = False

    def for_instance(self, model_name: str, scope: ArrayScope) -> PipeHost:
        return self

    def close(self) -> None:
        """The parent's host releases the instance's metric series."""

    @contextlib.contextmanager
    def parent_waiting(self) -> Iterator[None]:
        """The parent reads the pipe (and answers calls) while this block runs."""
        with self._lock:
            self._parent_waits = True
        try:
            yield
        finally:
            with self._lock:
                self._parent_waits = False

    def answer(self, data: bytes) -> None:
        """Send the parent the answer it waits for; calls are refused from then on."""
        with self._lock:
            self._parent_waits = False
            self.pipe.send_bytes(data)

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            self._check_waiting(f"pb_utils.{method}")
            self.pipe.send_bytes(_dumps(("call", method, args)))
            reply = self._conn.recv()
        if reply[0] == "raise":
            raise TritonModelException(str(reply[1]))
        return reply[1]

    def load_model(self, model_name: str, config: str, files: dict[str, bytes]) -> None:
        self._call("load_model", model_name, config, files)

    def unload_model(self, model_name: str) -> None:
        self._call("unload_model", model_name)

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        return bool(self._call("is_model_ready", model_name, model_version))

    def metric_family(self, name: str, description: str, kind: MetricKind) -> None:
        self._call("metric_family", name, description, int(kind))

    def metric_new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> int:
        return int(self._call("metric_new", family, labels, buckets))

    def metric_op(self, handle: int, op: str, value: float) -> float | None:
        result: float | None = self._call("metric_op", handle, op, value)
        return result

    def shared_array_open(self, name: str, shape: tuple[int, ...], dtype: str) -> tuple[str, int]:
        """The server answers with the role, then sends a copy of the segment's descriptor
        (SCM_RIGHTS) on the same socket: the server owns the segment, this process maps it."""
        with self._lock:
            self._check_waiting("inferd.shared_array", SharedArrayError)
            self.pipe.send_bytes(_dumps(("call", "shared_array_open", (name, shape, dtype))))
            reply = self._conn.recv()
            if reply[0] == "raise":
                raise SharedArrayError(str(reply[1]))
            return str(reply[1]), recv_handle(self._conn)

    def shared_array_built(self, name: str, error: str | None) -> None:
        with self._lock:
            self._check_waiting("inferd.shared_array", SharedArrayError)
            self.pipe.send_bytes(_dumps(("call", "shared_array_built", (name, error))))
            reply = self._conn.recv()
        if reply[0] == "raise":
            raise SharedArrayError(str(reply[1]))

    def _check_waiting(self, api: str, error: type[Exception] = TritonModelException) -> None:
        if not self._parent_waits:
            raise error(
                f'{api}: with isolation "process", calls that need the server work while the '
                "model's load, predict or unload (initialize, execute or finalize) runs"
            )

    def infer(self, call: BlsCall) -> concurrent.futures.Future[BlsResult]:
        return self._bls_client().infer(call)

    def infer_stream(self, call: BlsCall) -> Iterator[BlsResult]:
        return self._bls_client().infer_stream(call)

    def _bls_client(self) -> BlsClient:
        if self._bls is None:
            raise TritonModelException("BLS needs the inferd server the model runs in")
        return self._bls


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


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _as_result(result: Any) -> tuple[Any, ...]:
    """One request's result, picklable (InferdError does not unpickle: two arguments)."""
    if isinstance(result, InferdError):
        from inferd.tensors.conformance import OutputMismatchError

        return ("error", result.kind.value, result.message, isinstance(result, OutputMismatchError))
    return ("outputs", result)


def child_main(
    conn: Connection,
    log_conn: Connection,
    ready_conn: Connection,
    cancelled: Any,
    spec: ProcessSpec,
    bls_conn: Connection | None = None,
) -> None:
    """The child process: load the model, then answer batches until told to stop."""
    faulthandler.enable()  # a segfault's traceback goes to the inherited stderr
    if spec.env_paths:
        # The model's own environment first (spawn gave the child the server's sys.path):
        # model.py's imports find its packages; inferd's, already imported, stay the server's.
        sys.path[:0] = [p for p in spec.env_paths if p not in sys.path]
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_PipeLogHandler(log_conn))
    root.setLevel(spec.log_level)
    # Prints are always sent: the parent's logger levels decide whether they are kept.
    logging.getLogger("inferd.model").setLevel(logging.DEBUG)
    model_prints.install()

    host = PipeHost(conn, PipeSender(conn), None if bls_conn is None else BlsClient(bls_conn))
    ctx = dataclasses.replace(spec.load_context(), host=host)
    if spec.task == "auto_complete":
        try:
            conn.send(("completed", completed_config(ctx.model_name, ctx.version_dir, ctx.config)))
        except Exception as exc:
            conn.send(("load_failed", _describe(exc)))
        return
    with host.parent_waiting():
        try:
            module = import_model_module(ctx.model_name, ctx.version_dir, keep_on_path=True)
            decoupled = ctx.config.model_transaction_policy.decoupled
            if decoupled and hasattr(module, "TritonPythonModel") and not hasattr(module, "Model"):
                raise RuntimeError(
                    "a decoupled TritonPythonModel runs in the server process: isolation "
                    '"process" is not supported for it yet (decoupled inferd Models it is)'
                )
            instance = instantiate(ctx, module, probe_readiness=False)
        except Exception as exc:
            host.answer(_dumps(("load_failed", _describe(exc))))
            return
        probed = isinstance(instance, TritonPythonInstance) and instance.has_is_ready
        info = {
            "api": "triton" if isinstance(instance, TritonPythonInstance) else "inferd",
            "wants_request_info": bool(getattr(instance, "wants_request_info", False)),
            "is_ready": probed,
        }
        host.answer(_dumps(("ready", info)))
    if probed:
        threading.Thread(target=_answer_readiness, args=(ready_conn, instance), daemon=True).start()

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the server is gone
            break
        kind = message[0]
        if kind == "stop":
            unload_error = None
            with host.parent_waiting():
                try:
                    instance.close()
                except Exception as exc:
                    unload_error = _describe(exc)
                host.answer(_dumps(("stopped", unload_error)))
            break
        with host.parent_waiting():
            try:
                if kind == "execute" and isinstance(instance, PythonInstance):
                    inputs, infos = message[1], message[2]
                    outputs = (
                        instance.execute(inputs)
                        if infos is None
                        else instance.execute_with_info(inputs, infos)
                    )
                    data = _dumps(("ok", outputs))
                elif kind == "stream" and isinstance(instance, StreamingPythonInstance):
                    # Its messages go out as the model sends; "done" closes the exchange.
                    serve_stream(instance, message, host.pipe, cancelled)
                    continue
                elif kind == "execute_requests" and isinstance(instance, TritonPythonInstance):
                    requests = _requests(message[1], cancelled)
                    results = instance.execute_requests(requests)
                    answers = [
                        (*_as_result(res), req.response_parameters)
                        for res, req in zip(results, requests, strict=True)
                    ]
                    data = _dumps(("ok", answers))
                else:
                    raise RuntimeError(f"the worker got '{kind}' for a {type(instance).__name__}")
            except Exception as exc:
                data = _dumps(("error", _describe(exc)))
            host.answer(data)


def _requests(items: list[tuple[Any, ...]], cancelled: Any) -> list[BoundRequest]:
    """The batch's requests as the parent sent them; each reads its cancellation flag."""
    requests = []
    for i, item in enumerate(items):
        inputs, rows, names, request_id, parameters, timeout_us, correlation_id, flags = item
        request = BoundRequest(
            inputs,
            rows,
            (),
            names,
            request_id,
            parameters=parameters,
            timeout_us=timeout_us,
            correlation_id=correlation_id,
            flags=flags,
        )
        if i < len(cancelled):
            request.is_cancelled = lambda i=i: bool(cancelled[i])
        requests.append(request)
    return requests


def _answer_readiness(conn: Connection, instance: Any) -> None:
    """Answer the parent's `is_ready` probes: (question id, answer; False when it raised)."""
    while True:
        try:
            (question,) = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: Any = instance.check_ready()
        except Exception as exc:
            logging.getLogger("inferd.backends.python").warning(
                "is_ready() raised, reading as not ready: %s", _describe(exc)
            )
            answer = False
        try:
            conn.send((question, answer))
        except (OSError, ValueError):
            return
