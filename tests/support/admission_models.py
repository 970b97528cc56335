"""The admission tests' models (tests/integration/scheduling/test_admission.py): Python models that
record the values they executed, most of them held by a gate file until the test opens it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support.async_infer import PROTOCOLS
from tests.support.fault_models import RECORDING_PY, param, write_model


def body(value_: float, **parameters: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [value_]}]
    }
    if parameters:
        doc["parameters"] = parameters
    return doc


def write_admission_models(root: Path) -> None:
    """The models under root/models, their records under root/records, gates under root/gates."""
    records = root / "records"
    records.mkdir()
    (root / "gates").mkdir()

    def recording(name: str, delay_ms: int, dynamic: str = "") -> None:
        write_model(
            root / "models",
            name,
            RECORDING_PY,
            param("delay_ms", delay_ms) + param("record_path", records / name) + dynamic,
        )

    def gated(name: str, delay_ms: int, dynamic: str = "") -> None:
        write_model(
            root / "models",
            name,
            RECORDING_PY,
            param("delay_ms", delay_ms)
            + param("record_path", records / name)
            + param("gate_path", root / "gates" / name)
            + dynamic,
        )

    # `bounded` keeps its 300 ms per request for the gRPC test, which runs it ungated.
    gated("bounded", 300, "dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    # One per protocol: its case needs a model that has never timed an execution (with an
    # estimate, admission refuses the short deadline up front instead of queueing it).
    for protocol in PROTOCOLS:
        gated(
            f"timed_{protocol}",
            300,
            "dynamic_batching { default_queue_policy { default_timeout_microseconds: 5000000 "
            "allow_timeout_override: true } }",
        )
    gated("prioritised", 0, "dynamic_batching { priority_levels: 2 default_priority_level: 2 }")
    gated("slow", 300)
    # Only the inferd-timeout-ms test uses it: it must never have timed an execution, so
    # deadline-aware admission has no estimate and the late request queues, then times out.
    gated("unmeasured", 0)
    # Deadline-aware admission, each with its own execution time (no other test runs them).
    gated("backlogged", 300)
    recording("ponderous", 800)


def executed(repo: Path, model: str) -> list[int]:
    path = repo / "records" / model
    return [int(v) for v in path.read_text().split()] if path.exists() else []


@contextlib.contextmanager
def gate_closed(repo: Path, model: str) -> Iterator[Callable[[], None]]:
    """Hold `model`'s requests in its instance until the yielded function releases them."""
    path = repo / "gates" / model
    path.touch()

    def release() -> None:
        path.unlink(missing_ok=True)

    try:
        yield release
    finally:
        release()
