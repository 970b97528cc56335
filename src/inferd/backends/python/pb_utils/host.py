"""What model code may ask of the server it runs in: Triton's model loading API
(`load_model`, `unload_model`, `is_model_ready`), custom metrics and `get_model_dir`.

While a model's code runs (initialize, execute, finalize, is_ready, its async loop), the thread
is marked with the instance's `ModelHost` and version directory; the module-level functions
find them there. The server's host (`inferd.server.python_host`) acts in-process; in a
worker process (`isolation: "process"`) a host forwards each call to the server over the
worker's pipe.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import threading
from collections.abc import Iterator
from typing import Protocol

from inferd.backends.python.bls_request import BlsCall, BlsResult
from inferd.backends.python.pb_utils.triton_errors import TritonModelException
from inferd.backends.python.shared_array_store import ArrayScope

_current = threading.local()


class MetricKind(enum.IntEnum):
    """TRITONSERVER_MetricKind, as `MetricFamily.COUNTER` etc. hold it."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class ModelHost(Protocol):
    """The server side of the calls below; every failure raises TritonModelException."""

    def load_model(self, model_name: str, config: str, files: dict[str, bytes]) -> None: ...

    def unload_model(self, model_name: str) -> None: ...

    def is_model_ready(self, model_name: str, model_version: str) -> bool: ...

    def metric_family(self, name: str, description: str, kind: MetricKind) -> None: ...

    def metric_new(
        self, family: str, labels: dict[str, str], buckets: list[float] | None
    ) -> int: ...

    def metric_op(self, handle: int, op: str, value: float) -> float | None: ...

    # inferd.shared_array (backends/python/shared_arrays.py, backends/python/shared_array_store.py):
    def shared_array_open(self, name: str, shape: tuple[int, ...], dtype: str) -> tuple[str, int]:
        """("build" | "map", a descriptor of the segment, which the caller closes)."""
        ...

    def shared_array_built(self, name: str, error: str | None) -> None: ...
    def infer(self, call: BlsCall) -> concurrent.futures.Future[BlsResult]:
        """A call to another model (BLS): its response, as a future (never an exception:
        a failure is a result holding the error)."""
        ...

    def infer_stream(self, call: BlsCall) -> Iterator[BlsResult]:
        """A decoupled call: its responses as they come, the last one `final`."""
        ...


class InstanceModelHost(ModelHost, Protocol):
    """The host of one model instance; `close()` when the instance unloads."""

    def close(self) -> None: ...


class HostProvider(Protocol):
    """Gives each model instance its host (the server's, or a worker process's pipe)."""

    def for_instance(self, model_name: str, scope: ArrayScope) -> InstanceModelHost:
        """`scope`: the load the instance belongs to (whose instances share arrays)."""
        ...


@contextlib.contextmanager
def serving(host: ModelHost | None, model_dir: str) -> Iterator[None]:
    """Mark the current thread as running model code served by `host` (None: no server,
    e.g. a model object built outside inferd's server)."""
    before = (getattr(_current, "host", None), getattr(_current, "model_dir", None))
    _current.host, _current.model_dir = host, model_dir
    try:
        yield
    finally:
        _current.host, _current.model_dir = before


def current_host(api: str) -> ModelHost:
    """The host of the model code running in this thread; raises naming `api` if none."""
    host: ModelHost | None = getattr(_current, "host", None)
    if host is None:
        raise TritonModelException(
            f"{api} needs the inferd server the model runs in: call it from the model's "
            "initialize, execute, is_ready or finalize (not from a thread the model started, "
            "nor from auto_complete_config)"
        )
    return host


def current_array_host() -> ModelHost | None:
    """The host of the model code running in this thread, None outside a server (where
    `inferd.shared_array` has nobody to share with)."""
    host: ModelHost | None = getattr(_current, "host", None)
    return host


def get_model_dir() -> str:
    """The version directory holding the running model's model.py (Triton's get_model_dir)."""
    model_dir: str | None = getattr(_current, "model_dir", None)
    if model_dir is None:
        raise TritonModelException(
            "pb_utils.get_model_dir() is known only while the model's own code runs"
        )
    return model_dir


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model, as the repository API's load does: needs the admin API on
    (`--model-control-mode explicit` or `--admin-api on`), and `files` model uploads on."""
    if not isinstance(model_name, str) or not model_name:
        raise TritonModelException("pb_utils.load_model: model_name must be a non-empty string")
    current_host("pb_utils.load_model").load_model(model_name, config, dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model, as the repository API's unload does (admin API on)."""
    if unload_dependents:
        raise TritonModelException(
            "pb_utils.unload_model(unload_dependents=True) is not supported by inferd: "
            "an ensemble made of the model stays loaded, UNAVAILABLE until the model is back"
        )
    current_host("pb_utils.unload_model").unload_model(model_name)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the model (the given version, or its default one) is ready to serve."""
    return current_host("pb_utils.is_model_ready").is_model_ready(model_name, str(model_version))
