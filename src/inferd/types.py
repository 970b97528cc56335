"""The v2 request/response types: the only currency between adapters, core and scheduler."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy.typing as npt

Array = npt.NDArray[Any]
Parameters = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """Where a tensor lies in a registered system shared-memory region: Triton's tensor
    parameters `shared_memory_region`, `shared_memory_byte_size`, `shared_memory_offset`."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(slots=True)
class Tensor:
    """A named tensor; `data` is already shaped as `shape` with the dtype of `datatype`.

    `shared_memory`: on a request's input, where its data is to be read (the core replaces
    `data` with a view of the region before anything else reads it); on a response's
    output, where its data was written (the response then carries none, as Triton's)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array
    parameters: Parameters = field(default_factory=dict)
    shared_memory: SharedMemoryRef | None = None


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: Parameters = field(default_factory=dict)
    shared_memory: SharedMemoryRef | None = None  # write the output there


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str  # "" routes to the model's default version
    inputs: list[Tensor]
    id: str = ""
    outputs: list[RequestedOutput] | None = None  # None: every output of the model
    parameters: Parameters = field(default_factory=dict)
    # Some input or requested output names a shared-memory region: one flag for the core
    # to read, so requests without any (nearly all) pay nothing for the feature.
    uses_shared_memory: bool = False
    # The inputs' data lives in memory the sender reuses once answered (the engine hop's
    # slab; a client's shared-memory region too): whatever keeps an input past the answer
    # (capture, drift samples) copies it first.
    inputs_borrowed: bool = False
    # The generation of the signature a front end of `--engine` checked it against
    # (engine/model_table.py); 0: unchecked. Only the hop sets it, never a client.
    signature_generation: int = 0


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: Parameters = field(default_factory=dict)


def element_count(shape: tuple[int, ...]) -> int:
    # Python integers: a hostile shape must not wrap around int64 into a small count.
    return math.prod(shape)


def min_wire_bytes(tensors: list[Tensor]) -> int:
    """About the fewest bytes these tensors take on the wire: their binary form, exact for
    fixed-size datatypes, 4 per element for BYTES (the length prefix). Cheap: no element is
    looked at."""
    size = 0
    for t in tensors:  # a loop, not sum() over a generator: this runs twice per response
        size += t.data.size * 4 if t.datatype == "BYTES" else t.data.nbytes
    return size


# Sequence flags of a request (Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END): bits
# of `RequestInfo.flags()` for a Python model, set by the sequence batcher.
SEQUENCE_START = 1
SEQUENCE_END = 2


class RequestFields(Protocol):
    """What a backend may be told of each request of the batch it executes (a Python
    model's `RequestInfo` is made from these): the scheduler's checked request has them."""

    request_id: str
    rows: int
    correlation_id: int | str
    flags: int

    @property
    def parameters(self) -> Mapping[str, Any]: ...
