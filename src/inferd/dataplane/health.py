"""Whether the server and each model can serve: Triton's liveness and readiness."""

from __future__ import annotations

from inferd.dataplane.request_gate import RequestGate
from inferd.errors import ErrorKind, InferdError
from inferd.repository.model_state import ModelVersion
from inferd.repository.registry import ModelRegistry


class Health:
    def __init__(self, registry: ModelRegistry, gate: RequestGate) -> None:
        self.registry = registry
        self.gate = gate

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready means able to serve: not draining, every model has a version that loaded,
        whose circuit is closed, whose workers are alive, that has an instance not stuck
        past its execution timeout and that isn't failing (a run of failed executions, and
        then the probe that re-runs an input it took: scheduling/readiness_probe.py; one
        client's bad inputs fail that run but not the probe). Not merely "the process is
        up"."""
        if self.gate.is_shutting_down or not self.registry.is_ready():
            return False
        for model in self.registry.models.values():
            mv = model.default_version()
            if mv is not None and self.health_problem(model.name, mv):
                return False
        return True

    def health_problem(self, name: str, mv: ModelVersion) -> str:
        """Why a loaded version cannot be trusted to serve now, or ""."""
        model = self.registry.models[name]
        if model.circuit.held:
            return f"its circuit is held open by {model.circuit.held}"
        if model.circuit.is_open:
            return "its circuit breaker is open"
        batcher = mv.batcher
        if batcher is None:
            return "it is not loaded"
        if not batcher.instances_alive():
            return "an instance is down (its worker process died, or its is_ready() said no)"
        if not batcher.serving_instances():
            return "every instance is stuck in an execution past its execution timeout"
        return batcher.readiness_problem()

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            mv = self.registry.get(name, version)
        except InferdError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                raise
            return False
        return not self.gate.is_shutting_down and not self.health_problem(name, mv)
