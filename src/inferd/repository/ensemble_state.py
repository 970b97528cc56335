"""Whether each loaded ensemble can serve, kept in step with the models it is made of.

The registry calls `start_ensemble` for an ensemble version it loads, and `refresh_ensembles`
after any model's load or unload: an ensemble is READY only while every composing model has a
ready version (and the graph checks against their configs), UNAVAILABLE with the reason
otherwise, and READY again once they are back (Triton's rule).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from inferd.config.model_config import ConfigError, read_config
from inferd.pipelines.ensemble_config import is_ensemble
from inferd.repository.ensemble_load import (
    UNKNOWN,
    WAITING,
    Composing,
    composing_problem,
    ensemble_runner,
)
from inferd.repository.model_state import Model, ModelVersion, State

log = logging.getLogger("inferd.repository")


def lookup(
    models: dict[str, Model], on_disk: Callable[[], list[str]]
) -> Callable[[str, str], Composing]:
    """What the registry knows of a composing model (name, version or "" for its default).
    The repository directory is listed at most once per lookup, only for a model not loaded."""
    listed: list[set[str]] = []

    def find(name: str, version: str) -> Composing:
        model = models.get(name)
        if model is None:
            if not listed:
                try:
                    listed.append(set(on_disk()))
                except OSError:
                    listed.append(set())
            present = name in listed[0]
            if not present:
                return Composing(None, "no such model in the repository", known=False)
            return Composing(None, "not loaded")
        if version:
            mv = model.versions.get(version)
            if mv is None:
                if model.versions:
                    loaded = ", ".join(sorted(model.versions, key=int))
                    return Composing(None, f"not a loaded version (loaded: {loaded})", False)
                return Composing(None, model.reason or "not loaded")
        else:
            mv = model.default_version()
        if mv is None or not mv.is_ready:
            reason = model.reason or (mv.reason if mv is not None else "") or _first(model)
            return Composing(None, reason or "no ready version")
        return Composing(mv.config)

    return find


def _first(model: Model) -> str:
    return next((v.reason for v in model.versions.values() if v.reason), "")


def start_ensemble(mv: ModelVersion, find: Callable[[str, str], Composing]) -> None:
    """Give a freshly loaded ensemble version its runner, and its state."""
    mv.ensemble = ensemble_runner(mv.config, mv.version)
    mv.batcher = mv.ensemble
    _settle(mv, find)


def _settle(mv: ModelVersion, find: Callable[[str, str], Composing]) -> bool:
    """Set the version's state from its composing models; whether it changed.

    Not ready (yet) is waiting. A composing model unknown, or a graph that does not fit the
    composing models, fails the ensemble's load, and holds the server's readiness down like
    any failed load, until it is fixed (the model appears, the composing model is reloaded
    with a config that fits): then the ensemble is READY without being loaded again. A
    composing model that is gone after the ensemble served (deleted from the repository in
    poll mode) leaves it waiting, as an unload does."""
    assert mv.ensemble is not None
    problem, kind = composing_problem(mv.ensemble.graph, mv.config, find)
    served = mv.is_ready or bool(mv.waits_for)
    waiting = kind == WAITING or (kind == UNKNOWN and served)
    before = (mv.state, mv.reason)
    if problem:
        mv.state = State.UNAVAILABLE
        mv.reason = problem
        mv.waits_for = problem if waiting else ""
    else:
        mv.state = State.READY
        mv.reason = mv.waits_for = ""
    changed = before != (mv.state, mv.reason)
    if changed:
        if problem:
            log.warning("ensemble %s version %s is unavailable: %s", mv.name, mv.version, problem)
        else:
            log.info("ensemble %s version %s is ready", mv.name, mv.version)
    return changed


def refresh_ensembles(models: dict[str, Model], find: Callable[[str, str], Composing]) -> None:
    """Re-decide every loaded ensemble version's state (until none changes: an ensemble may
    be a step of another)."""
    versions = [
        mv
        for model in models.values()
        for mv in model.versions.values()
        if mv.ensemble is not None and mv.state is not State.UNLOADING
    ]
    for _ in range(len(versions) + 1):
        changed = [_settle(mv, find) for mv in versions]  # each settles, every pass
        if not any(changed):
            return


def only_waits(model: Model) -> bool:
    """An ensemble whose every version only waits for composing models: not counted against
    the server's readiness (the composing model's own state is)."""
    return bool(model.versions) and all(v.waits_for for v in model.versions.values())


def ensembles_among(repository: Path, names: list[str]) -> list[str]:
    """Which of the models `names` are ensembles (loaded last at start). Reads the configs:
    run it off the event loop."""
    found = []
    for name in names:
        try:
            config, _ = read_config(repository / name)
        except (ConfigError, OSError):
            continue  # its own load reports it
        if is_ensemble(config):
            found.append(name)
    return found
