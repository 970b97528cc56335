"""What both ends of a Python model's worker pipe share: the spec the child loads the model
from, and an `InferdError`'s form on the wire. Neither end imports the other's module for
these, so the parent's side (pipe, isolated_instance, parent_stream) and the child's
(child, child_stream) stay one-directional."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.errors import ErrorKind, InferdError


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """Everything the child needs to load the model; picklable."""

    model_name: str
    version: str
    version_dir: Path
    config: bytes  # the ModelConfig, serialized
    instance_index: int
    instance_count: int
    log_level: int  # the parent's root level: records below it are not sent
    task: str = "serve"  # or "auto_complete": run auto_complete_config, answer, exit
    # The model's own environment (EXECUTION_ENV_PATH, execution_env.py): the interpreter
    # the process runs ("": the server's), and its paths, put first on the child's sys.path.
    env_python: str = ""
    env_paths: tuple[str, ...] = ()

    @classmethod
    def from_context(
        cls, ctx: LoadContext, task: str = "serve", env: tuple[str, tuple[str, ...]] = ("", ())
    ) -> ProcessSpec:
        return cls(
            ctx.model_name,
            ctx.version,
            ctx.version_dir,
            ctx.config.SerializeToString(),
            ctx.instance_index,
            ctx.instance_count,
            logging.getLogger().getEffectiveLevel(),
            task,
            *env,
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


Wire = tuple[str, str] | None  # an InferdError across the pipe: (kind, message)


def to_wire(error: InferdError | None) -> Wire:
    return None if error is None else (error.kind.value, error.message)


def from_wire(error: Wire) -> InferdError | None:
    return None if error is None else InferdError(ErrorKind(error[0]), error[1])
