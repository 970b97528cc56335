"""The contract between the scheduler and a backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.python.shared_array_store import ArrayScope
from inferd.config.backend_parameters import BackendSettings, read_backend_settings
from inferd.errors import InferdError
from inferd.types import Array, RequestFields

if TYPE_CHECKING:
    from inferd.backends.python.pb_utils.host import HostProvider
    from inferd.tensors.signature import BoundRequest


@dataclass(frozen=True, slots=True)
class LoadContext:
    model_name: str
    version: str
    version_dir: Path
    config: mc.ModelConfig
    instance_index: int
    instance_count: int
    # What Python models may ask of the server (pb_utils.load_model, custom metrics);
    # None outside a server.
    host: HostProvider | None = None
    # The model spec's backend settings, parsed at load; None (a context built from a bare
    # config: a worker process, a test): read from `config`.
    settings: BackendSettings | None = None
    # Which load of the version this is (each loader call is another): its instances share
    # `inferd.shared_array`s, a reload (whose files may have changed) builds its own.
    load: int = 0

    def array_scope(self) -> ArrayScope:
        return ArrayScope(self.model_name, self.version, self.load)

    def backend_settings(self) -> BackendSettings:
        return self.settings if self.settings is not None else read_backend_settings(self.config)


class Instance(Protocol):
    """One loaded copy of a model. `execute` is called from one worker thread at a time."""

    device: str  # where it actually runs, e.g. "cpu" or "cuda:0"
    provider: str  # what executes it, e.g. "CUDAExecutionProvider", "torch", "python"

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        """Run one batch: inputs carry the batch dimension first when the model batches.

        Returns every output the model produces, each with the same leading batch size.
        The caller owns the arrays afterwards; raising fails every request in the batch.
        """
        ...

    def close(self) -> None:
        """Release the instance's memory; it is not called again afterwards."""
        ...


@runtime_checkable
class RequestListInstance(Protocol):
    """An instance that takes the batch's requests one by one instead of merged tensors
    (Triton's Python-backend contract: `execute(requests)` returns one response each)."""

    device: str
    provider: str

    def execute_requests(
        self, requests: list[BoundRequest]
    ) -> list[dict[str, Array] | InferdError]:
        """One result per request, in order: its outputs, or an error failing it alone."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RequestInfoInstance(Protocol):
    """An `Instance` that can also be told who sent each request of the merged batch
    (inferd's Python models whose `predict` takes a second argument: the request id,
    rows, parameters, correlation id and sequence flags of each request)."""

    device: str
    provider: str
    wants_request_info: bool  # False: `execute` is enough, skip building the infos

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]: ...

    def execute_with_requests(
        self, inputs: dict[str, Array], requests: Sequence[RequestFields]
    ) -> dict[str, Array]:
        """`execute`, told who sent each request of the batch, in row order."""
        ...

    def close(self) -> None: ...


AnyInstance = Instance | RequestListInstance


@runtime_checkable
class SupervisedInstance(Protocol):
    """An instance whose model runs in a worker process that can die and be restarted
    (a Python model with `isolation: "process"`)."""

    def is_alive(self) -> bool:
        """False while a worker process is dead and not yet restarted (or could not be)."""
        ...


@runtime_checkable
class ReplaceableInstance(Protocol):
    """An instance whose execution can be ended from outside when it hangs: its model runs
    in a worker process, which is killed (the execution fails) and started again."""

    # time.monotonic() when the latest execution reached a live worker; None while one
    # waits for a worker to start (that wait is not execution time).
    execution_started: float | None

    def kill_process(self, reason: str) -> None:
        """Kill the worker process now (logging `reason`); a new one loads the model."""
        ...


class Backend(Protocol):
    model_file: str  # the file a version directory must hold, e.g. "model.onnx"
    model_files: tuple[str, ...]  # every file name it can load, in order of preference
    # BYTES inputs reach the model as text, so they must be UTF-8 (checked at the edge).
    decodes_bytes_as_text: bool
    # Optional, False when absent: request parameters reach the model (the Python backend),
    # so `bind` checks them and hands them over in BoundRequest.parameters.
    # passes_request_parameters: bool

    def complete_config(self, config: mc.ModelConfig, version_dir: Path) -> None:
        """Fill what the config leaves out (inputs, outputs, batching) from the model file.

        Raises `ConfigError` when the config contradicts the model file.
        """
        ...

    def load(self, ctx: LoadContext) -> AnyInstance:
        """Load one instance; raises with a readable message when the model can't load."""
        ...
