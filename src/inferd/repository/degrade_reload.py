"""A model's tiers after a (re)load of its config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferd.reliability.degrade.controller import Degradation
from inferd.reliability.degrade.tiers import DegradePolicy

if TYPE_CHECKING:
    from inferd.repository.model_state import Model


def configure_degradation(model: Model, policy: DegradePolicy | None) -> None:
    """After a (re)load: the model's tiers as its config now declares them (None: it was
    unloaded). Unchanged tiers keep their state (a reload of the same config is no
    recovery); new or removed ones, and a load after an unload, start from tier 0, releasing
    a circuit the old tiers held open."""
    current = model.degrade
    if current is not None and policy is not None and current.policy == policy:
        return
    if current is not None and current.current is not None and current.current.open_circuit:
        model.circuit.release_hold()
    model.degrade = Degradation(model.name, policy) if policy and policy.enabled else None
