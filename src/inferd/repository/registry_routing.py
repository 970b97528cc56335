"""The registry's canary routing calls (the repository API's routing, promote and rollback):
each changes a model's weights between its loaded versions and says so."""

from __future__ import annotations

import logging
from collections.abc import Callable

from inferd.errors import not_found
from inferd.reliability.routing import parse_weights
from inferd.repository.model_state import Model, ready_versions

log = logging.getLogger("inferd.repository")


class RoutingCalls:
    """A mixin of ModelRegistry: it holds the models and the change callback."""

    models: dict[str, Model]
    changed: Callable[[], None]

    def set_weights(self, name: str, raw: object) -> dict[str, int]:
        model = self._model(name)
        weights = parse_weights(raw, f"model '{name}' routing")
        model.router.set_weights(weights, ready_versions(model), name)
        self.changed()
        log.info("model %s routing weights set to %s", name, weights)
        return weights

    def promote(self, name: str, version: str) -> dict[str, int]:
        model = self._model(name)
        model.router.promote(version, ready_versions(model), name)
        self.changed()
        log.info("model %s routing weights set to %s", name, model.router.weights)
        return dict(model.router.weights)

    def rollback(self, name: str, version: str = "") -> dict[str, int]:
        """Undo the last step forward (`Router.rollback`)."""
        model = self._model(name)
        model.router.rollback(version, name)
        self.changed()
        log.info("model %s rolled back; routing weights now %s", name, model.router.weights)
        return dict(model.router.weights)

    def _model(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise not_found(f"unknown model '{name}'")
        return model
