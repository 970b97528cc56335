"""The vocabulary of `fields.FIELDS`: a field's status, its rule, the checks of single
values, and the reasons several fields share."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc


class Status(enum.Enum):
    HONOURED = "honoured"
    REFUSED = "refused"  # fails the load, naming file and field
    HINT = "hint"  # taken as a wish: where it cannot be met, a warning and what was done


# A check of one set value, given the message holding it: "" when fine, else why not.
ValueCheck = Callable[[Any, Any], str]


@dataclass(frozen=True, slots=True)
class FieldRule:
    status: Status
    note: str  # honoured/hint: what inferd does with it; refused: why, and what to do
    backends: tuple[str, ...] = ()  # honoured only for these backends (others refuse it)
    check: ValueCheck | None = None  # refuses some values of an honoured field


def honoured(
    note: str, backends: tuple[str, ...] = (), check: ValueCheck | None = None
) -> FieldRule:
    return FieldRule(Status.HONOURED, note, backends, check)


def refused(reason: str) -> FieldRule:
    return FieldRule(Status.REFUSED, reason)


def hint(note: str, check: ValueCheck | None = None) -> FieldRule:
    return FieldRule(Status.HINT, note, (), check)


def each(rule: FieldRule, *paths: str) -> dict[str, FieldRule]:
    return dict.fromkeys(paths, rule)


GROUP = "a group: its fields are classified one by one"
TENSORRT = "a TensorRT setting; inferd has no TensorRT backend"
CUDA_TUNING = "CUDA tuning inferd does not do (no CUDA graphs, streams or pinned buffers)"
# Backends that take inputs by name, so the server's control and state tensors reach them.
SEQUENCE_INPUT_BACKENDS = ("onnxruntime", "python")
# Backends whose models take the merged batch by input name (the batch inputs are extra
# inputs); TritonPythonModel models get each request's own tensors instead.
RAGGED_BACKENDS = ("onnxruntime", "python")
BATCH_INPUT = "computed by the server for each batch from the source input's shapes"
ENSEMBLE = "the ensemble's steps (pipelines/ensemble_config.py, docs/pipelines.md)"
RATE_LIMIT = "inferd has no rate limiter; bound the load with instance counts and queue policy"
DELAY_NOT_IMPLEMENTED = (
    "DELAY is not implemented (Triton moves a timed-out request behind the others; inferd "
    "would keep it in place, as if it had no timeout); use REJECT, or no timeout"
)


def kind_check(_group: Any, kind: int) -> str:
    if kind == mc.ModelInstanceGroup.KIND_MODEL:
        return (
            "KIND_MODEL is not supported: inferd places instances itself; use KIND_CPU, "
            "KIND_GPU or KIND_AUTO"
        )
    return ""


def gpus_check(group: Any, _gpus: Any) -> str:
    if group.kind == mc.ModelInstanceGroup.KIND_CPU:
        return "GPUs are listed but kind is KIND_CPU (Triton's rule: gpus need KIND_GPU)"
    return ""


def timeout_action_check(policy: Any, action: int) -> str:
    delays = action == mc.ModelQueuePolicy.DELAY
    if delays and (policy.default_timeout_microseconds or policy.allow_timeout_override):
        return DELAY_NOT_IMPLEMENTED
    return ""


def format_check(tensor: Any, _format: int) -> str:
    # Triton's rule: an image format describes three dimensions (CHW or HWC).
    if len(tensor.dims) != 3:
        return f"format {mc.ModelInput.Format.Name(_format)} needs 3 dims, got {list(tensor.dims)}"
    return ""


QUEUE_POLICY = {
    "timeout_action": honoured(
        "REJECT (the default) answers a timed-out request 504; DELAY is accepted only where "
        "no timeout applies",
        check=timeout_action_check,
    ),
    "default_timeout_microseconds": honoured(
        "a queued request waits at most this long (docs/reliability.md)"
    ),
    "allow_timeout_override": honoured("a request's `timeout` parameter may shorten it"),
    "max_queue_size": honoured("past it, a request is shed at once: 429 / RESOURCE_EXHAUSTED"),
}
