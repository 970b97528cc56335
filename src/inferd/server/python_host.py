"""The server's side of `pb_utils`' model loading, custom metrics and BLS calls, and of
`inferd.shared_array` (`ModelHost`).

`ServerHost` is one per server: it runs repository calls on the server's event loop (model
code runs in worker threads; it waits for the answer there, never on the loop) and keeps the
custom metrics and the shared arrays' store. Each model instance gets an `InstanceHost` that
names the calling model in errors and releases the instance's metric series and shared arrays
when it unloads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from inferd.backends.python.bls_request import BlsCall, BlsResult, current_callers
from inferd.backends.python.custom_metrics import CustomMetrics, MetricError
from inferd.backends.python.pb_utils.host import MetricKind
from inferd.backends.python.pb_utils.triton_errors import TritonModelException
from inferd.backends.python.shared_array_store import ArrayScope, SharedArrayStore
from inferd.dataplane.bls_runner import BlsError, BlsRunner
from inferd.errors import ErrorKind, InferdError

if TYPE_CHECKING:
    from inferd.dataplane.plane import DataPlane

T = TypeVar("T")


class ServerHost:
    def __init__(self, dataplane: DataPlane, metrics: CustomMetrics) -> None:
        self.dataplane = dataplane
        self.metrics = metrics
        self.arrays = SharedArrayStore()  # inferd.shared_array's segments
        self.bls = BlsRunner(dataplane.internal, dataplane.registry)
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the repository and BLS calls run on (the server's, once it runs)."""
        self._loop = loop
        self.bls.bind_loop(loop)

    def for_instance(self, model_name: str, scope: ArrayScope) -> InstanceHost:
        return InstanceHost(self, model_name, scope)

    def on_loop(self, api: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise TritonModelException(f"{api}: the server is not running")
        if _on_loop(loop):  # waiting here for the loop would block it for good
            raise TritonModelException(f"{api} cannot be called from the server's event loop")
        return asyncio.run_coroutine_threadsafe(make(), loop).result()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class InstanceHost:
    """`ModelHost` for one model instance (pb_utils.host.ModelHost)."""

    def __init__(self, server: ServerHost, model_name: str, scope: ArrayScope) -> None:
        self._server = server
        self._model = model_name
        self._scope = scope
        self._handles: list[int] = []
        self._lock = threading.Lock()

    def _not_self(self, api: str, model_name: str) -> None:
        if model_name == self._model:
            raise TritonModelException(
                f"{api}('{model_name}'): a model cannot load or unload itself (it would wait "
                "for its own load or drain)"
            )

    def load_model(self, model_name: str, config: str, files: dict[str, bytes]) -> None:
        api = "pb_utils.load_model"
        self._not_self(api, model_name)
        parameters: dict[str, Any] = {"config": config} if config else {}
        for path, data in files.items():
            key = path if path.startswith("file:") else f"file:{path}"
            parameters[key] = data
        dp = self._server.dataplane
        try:
            self._server.on_loop(api, lambda: dp.admin.load_model(model_name, parameters))
        except InferdError as exc:
            raise TritonModelException(f"{api}('{model_name}'): {exc.message}") from None

    def unload_model(self, model_name: str) -> None:
        api = "pb_utils.unload_model"
        self._not_self(api, model_name)
        dp = self._server.dataplane
        try:
            self._server.on_loop(api, lambda: dp.admin.unload_model(model_name))
        except InferdError as exc:
            raise TritonModelException(f"{api}('{model_name}'): {exc.message}") from None

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        dp = self._server.dataplane

        async def ready() -> bool:
            try:
                return dp.health.model_ready(model_name, model_version)
            except InferdError as exc:  # no such model or version: not ready
                if exc.kind is ErrorKind.NOT_FOUND:
                    return False
                raise TritonModelException(
                    f"pb_utils.is_model_ready('{model_name}'): {exc.message}"
                ) from None

        return self._server.on_loop("pb_utils.is_model_ready", ready)

    def infer(self, call: BlsCall) -> concurrent.futures.Future[BlsResult]:
        """A BLS call, for the requests this thread executes (bls_request.executing)."""
        try:
            return self._server.bls.submit(call, current_callers())
        except BlsError as exc:
            raise TritonModelException(str(exc)) from None

    def infer_stream(self, call: BlsCall) -> Iterator[BlsResult]:
        try:
            return self._server.bls.stream(call, current_callers())
        except BlsError as exc:
            raise TritonModelException(str(exc)) from None

    def metric_family(self, name: str, description: str, kind: MetricKind) -> None:
        try:
            self._server.metrics.family(name, description, kind)
        except MetricError as exc:
            raise TritonModelException(str(exc)) from None

    def metric_new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> int:
        try:
            handle = self._server.metrics.new(family, labels, buckets)
        except MetricError as exc:
            raise TritonModelException(str(exc)) from None
        with self._lock:
            self._handles.append(handle)
        return handle

    def metric_op(self, handle: int, op: str, value: float) -> float | None:
        try:
            return self._server.metrics.op(handle, op, value)
        except MetricError as exc:
            raise TritonModelException(str(exc)) from None

    def shared_array_open(self, name: str, shape: tuple[int, ...], dtype: str) -> tuple[str, int]:
        return self._server.arrays.open(self._scope, self, name, shape, dtype)

    def shared_array_built(self, name: str, error: str | None) -> None:
        self._server.arrays.built(self._scope, self, name, error)

    def close(self) -> None:
        """The instance unloaded: its metric series go (those no other instance holds), and
        the shared arrays no other instance holds."""
        with self._lock:
            handles, self._handles = self._handles, []
        self._server.metrics.release(handles)
        self._server.arrays.release(self)
