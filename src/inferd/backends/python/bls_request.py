"""What a model's own code sends when it calls another model (BLS: Triton's business logic
scripting), and what it gets back: plain, picklable values, the same in the server process
and over a worker process's pipe.

Which requests the call is made on behalf of travels beside it, not in it: while a batch
executes, `executing(...)` marks the instance's thread (a context variable, so the
coroutines of an `async def execute` started from that thread see it too) with the batch's
`Caller`s. The server side (dataplane/bls_runner.py) reads them: the call inherits their deadline
and
trace context, and is cancelled once every one of them has been given up on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from inferd.backends.executing import EXECUTING
from inferd.events import CallContext
from inferd.types import Array

# How many responses of a decoupled call may wait for the model to take them (on the
# server's loop, and again in a worker process): past that, the call stops reading the
# called model's stream, whose own bounded queue then holds its sender.
STREAM_AHEAD = 8


@dataclass(slots=True)
class BlsCall:
    """One request a model sends to `model_name`."""

    model_name: str
    model_version: str = ""  # "": the model's default version
    inputs: dict[str, Array] = field(default_factory=dict)
    output_names: list[str] | None = None  # None: every output of the model
    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # request parameters, as sent
    timeout_us: int = 0  # 0: none; else it tightens the caller's deadline
    decoupled: bool = False  # a stream of responses (any number), not one


@dataclass(slots=True)
class BlsResult:
    """One response: outputs, or an error (the name of its `ErrorKind` and the text a
    client would read); `final` on a stream's last item (which may hold neither: the final
    flag alone)."""

    outputs: dict[str, Array] | None = None
    error_kind: str = ""
    error: str = ""
    final: bool = True
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Caller:
    """A request of the batch executing: its context, and its scheduler future (done while
    the batch still runs means its client gave up; None: not watched, e.g. a decoupled
    request, whose future resolves when `execute` returns while its stream goes on)."""

    ctx: CallContext | None
    given_up: asyncio.Future[Any] | None


class _Request(Protocol):
    @property
    def ctx(self) -> CallContext | None: ...

    @property
    def responses(self) -> object: ...  # a decoupled request's stream; None otherwise


class Executing(Protocol):
    """What the scheduler holds for a request of the batch (scheduling.pending.Pending)."""

    @property
    def request(self) -> _Request: ...

    @property
    def future(self) -> asyncio.Future[Any]: ...


def current_callers() -> tuple[Caller, ...]:
    """The callers of the batch this thread executes; () outside an execution."""
    return tuple(
        c if isinstance(c, Caller) else _caller(cast(Executing, c)) for c in EXECUTING.get()
    )


def _caller(c: Executing) -> Caller:
    return Caller(c.request.ctx, c.future if c.request.responses is None else None)


@contextlib.contextmanager
def executing(callers: tuple[Caller, ...]) -> Iterator[None]:
    """Mark this thread as executing for `callers`."""
    token = EXECUTING.set(callers)
    try:
        yield
    finally:
        EXECUTING.reset(token)
