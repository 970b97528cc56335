"""Loading an ensemble version, and deciding whether it can serve.

An ensemble has no files or instances: its version directory (`recall_rank/1/`) is empty, and
its "scheduler" is the `Ensemble` runner. Whether it is READY depends on other models, so the
registry asks `composing_problem` after its own load and again whenever any model is loaded or
unloaded: an ensemble whose composing models are not (yet) ready is UNAVAILABLE with the
reason and `waits_for` set; once they are, the graph is checked against their configs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import AnyInstance, LoadContext
from inferd.config.model_config import CONFIG_FILE, ConfigError, validate
from inferd.datatypes import CONFIG_TO_V2
from inferd.pipelines.ensemble import Ensemble
from inferd.pipelines.ensemble_config import (
    EnsembleGraph,
    GraphError,
    check_composing,
    check_ensemble_fields,
    parse_graph,
)
from inferd.repository.spec import ModelSpec, parse_spec


class EnsemblePlatform:
    """The `Backend` an ensemble's config resolves to: nothing to complete, nothing to load
    (the registry gives the version an `Ensemble` runner instead of instances)."""

    model_file = ""
    model_files: tuple[str, ...] = ()
    decodes_bytes_as_text = False
    # The request's own parameters are checked and handed to every step (as Triton does).
    passes_request_parameters = True

    def complete_config(self, config: mc.ModelConfig, version_dir: Path) -> None:
        pass

    def load(self, ctx: LoadContext) -> AnyInstance:
        raise RuntimeError("an ensemble has no instances; its steps' models do")


ENSEMBLE_BACKEND = EnsemblePlatform()


def prepare_ensemble(
    config: mc.ModelConfig, model_dir: Path, versions: list[int]
) -> tuple[mc.ModelConfig, EnsemblePlatform, list[int], ModelSpec]:
    """`loader.prepare` for an ensemble: its own config checked, its graph parsed."""
    where = f"{model_dir.name}/{CONFIG_FILE}"
    if not versions:
        raise ConfigError(f"{where}: version_policy selects none of the version directories")
    try:
        check_ensemble_fields(config, where)
        parse_graph(config, where)
    except GraphError as exc:
        raise ConfigError(str(exc)) from None
    validate(config, model_dir)
    return config, ENSEMBLE_BACKEND, versions, parse_spec(config, model_dir)


def ensemble_runner(config: mc.ModelConfig, version: str) -> Ensemble:
    graph = parse_graph(config, f"{config.name}/{CONFIG_FILE}")  # checked by prepare already
    datatypes = {t.name: CONFIG_TO_V2[t.data_type] for t in config.input}
    return Ensemble(graph, version, datatypes)


@dataclass(frozen=True, slots=True)
class Composing:
    """What the registry knows of a step's composing model: its serving config, or why not."""

    config: mc.ModelConfig | None
    reason: str = ""  # why there is no ready version
    known: bool = True  # False: no such model (loaded or on disk) or version at all


# (model name, version or "") -> what the registry knows of it
Lookup = Callable[[str, str], Composing]


# What keeps an ensemble from serving: a composing model not ready (yet), one that does not
# exist (or no longer), or a graph that does not fit the composing models' configs.
WAITING, UNKNOWN, MISMATCH = "waiting", "unknown", "mismatch"


def composing_problem(
    graph: EnsembleGraph, config: mc.ModelConfig, lookup: Lookup
) -> tuple[str, str]:
    """("", "") when the ensemble can serve; else (why not, WAITING, UNKNOWN or MISMATCH)."""
    composing: dict[int, mc.ModelConfig] = {}
    for step in graph.steps:
        found = lookup(step.model, step.version)
        version = f" version {step.version}" if step.version else ""
        if not found.known:
            return (
                f"ensemble '{graph.name}' {step.label}: unknown composing model "
                f"'{step.model}'{version}: {found.reason}",
                UNKNOWN,
            )
        if found.config is None:
            return (
                f"ensemble '{graph.name}' {step.label}: composing model '{step.model}'"
                f"{version} is not ready" + (f": {found.reason}" if found.reason else ""),
                WAITING,
            )
        composing[step.number] = found.config
    try:
        check_composing(graph, config, composing)
    except GraphError as exc:
        return str(exc), MISMATCH
    return "", ""
