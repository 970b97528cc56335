"""What the data plane, the registry and the metrics need of a model version's scheduler:
the dynamic batcher (`batcher.py`) and the sequence batcher
(`scheduling/sequence/sequence_batcher.py`)."""

from __future__ import annotations

from typing import Protocol

from inferd.scheduling.load_signal import LoadSample
from inferd.scheduling.pending import Outcome
from inferd.tensors.signature import BoundRequest


class Scheduler(Protocol):
    name: str
    version: str

    def readiness_problem(self) -> str:
        """Why its failed executions make the version unready, or "" (readiness_probe.py)."""
        ...

    async def submit(
        self,
        request: BoundRequest,
        priority: int = 0,
        timeout_us: int = 0,
        deadline_ns: int | None = None,
    ) -> Outcome: ...

    def queue_depth(self) -> int: ...

    def load_sample(self) -> LoadSample: ...

    def inflight(self) -> int: ...

    def refuses_all(self) -> bool: ...

    def instances_alive(self) -> bool: ...

    def serving_instances(self) -> int:
        """Instances not stuck in an execution past the execution timeout (readiness)."""
        ...

    def unhealthy_instances(self) -> int:
        """Instances stuck past the execution timeout or with a dead worker process."""
        ...

    async def stop(self) -> None: ...
