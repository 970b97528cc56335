"""What a scheduler holds for a queued request, and what an execution answers it with:
shared by batch formation (`batcher.py`, `scheduling/sequence/sequence_batches.py`) and execution
(`execution.py`, `run_batch.py`, `isolate.py`), so neither imports the other's module."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferd.errors import InferdError
from inferd.events import ExecutionTimes
from inferd.tensors.signature import BoundRequest
from inferd.types import Array


class BatchClose(enum.Enum):
    """Why a batch left the queue: the answer to "why doesn't it batch?"."""

    FULL = "full"
    PREFERRED_SIZE = "preferred_size"
    MAX_DELAY = "max_delay"
    SHAPE_MISMATCH = "shape_mismatch"
    # Length grouping: the queued request nearest in length would have padded the batch past
    # its bound (pad_grouping_waste).
    LENGTH = "length"
    QUEUE_EMPTY = "queue_empty"


Outcome = tuple[dict[str, Array], ExecutionTimes]


@dataclass(slots=True, eq=False)
class Pending:
    request: BoundRequest
    future: asyncio.Future[Outcome]
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    # Waiting in the batcher's queue: its rows count in queued_rows and queue depth; False
    # once it is taken into a batch, cancelled or timed out (formation skips it then).
    is_queued: bool = True
    deadline_ns: int | None = None  # perf_counter_ns past which it must not execute
    level: int = 0  # its priority level (0-based) in the batcher's queue
    # A row the sequence batcher adds to keep other sequences in their batch slots (Triton's
    # null request): executed, never answered, never counted.
    filler: bool = False


Result = dict[str, Array] | InferdError
# Called on the event loop with a batch's per-request results, before they are answered; it
# returns the results to answer with (the sequence batcher keeps each sequence's state here).
Finish = Callable[[list[Pending], list[Result]], list[Result]]
