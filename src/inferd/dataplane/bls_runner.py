"""The server's side of a model's calls to other models (BLS): each `BlsCall` runs on the server's
event loop through the DataPlane's internal calls (internal_requests.py: the called model's
routing, admission, batching, statistics and metrics apply as to a client's request), on behalf
of the requests the calling instance executes (bls_request.Caller): their deadline and trace
carry over, the call's own `timeout_us` tightens the deadline, and the call is cancelled once
every one of them was given up on (a client that left: its BLS calls not yet run never run).

A failure is an answer, not an exception (Triton returns the error in the response): a
missing or unready model, a bad input, a passed deadline come back as a `BlsResult` whose
`error` the model reads. Model code waits in its own thread or loop, never on the
server's: `submit` and `stream` refuse to be called from the server's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any

from inferd.backends.python.bls_request import STREAM_AHEAD, BlsCall, BlsResult, Caller
from inferd.dataplane.internal_requests import InternalCalls
from inferd.datatypes import v2_datatype
from inferd.errors import ErrorKind, InferdError
from inferd.events import CallContext
from inferd.streams import StreamResponse
from inferd.types import InferRequest, InferResponse, RequestedOutput, Tensor

if TYPE_CHECKING:
    from inferd.repository.registry import ModelRegistry

log = logging.getLogger("inferd.bls")


class BlsError(Exception):
    """The call cannot be made at all (from the server's loop, with the server stopped)."""


class BlsRunner:
    def __init__(self, calls: InternalCalls, registry: ModelRegistry) -> None:
        self._calls = calls
        self._registry = registry
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _server_loop(self, api: str) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise BlsError(f"{api}: the server is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # waiting here for the loop would block it for good
            raise BlsError(f"{api} cannot be called from the server's event loop")
        return loop

    def submit(
        self, call: BlsCall, callers: tuple[Caller, ...]
    ) -> concurrent.futures.Future[BlsResult]:
        """The call's one response, once it comes (from any thread but the server loop's)."""
        loop = self._server_loop("BLS")
        return asyncio.run_coroutine_threadsafe(self._one(call, callers), loop)

    def stream(self, call: BlsCall, callers: tuple[Caller, ...]) -> Iterator[BlsResult]:
        """The call's responses, as the model takes them, the last one `final`."""
        loop = self._server_loop("BLS")
        return _StreamReader(loop, self._pump(call, callers))

    async def _one(self, call: BlsCall, callers: tuple[Caller, ...]) -> BlsResult:
        try:
            with _Watched(callers):
                parent = parent_context(callers, call.timeout_us)
                self._refuse_decoupled(call)
                response = await self._calls.call_model(to_request(call), parent)
                return _result(response, True)
        except InferdError as exc:
            return _failed(exc.kind, exc.message)
        except asyncio.CancelledError:
            return _cancelled(call)
        except Exception as exc:  # a bug of inferd's: the model reads it, the server goes on
            log.exception("BLS call to model '%s' failed", call.model_name)
            return _failed(ErrorKind.INTERNAL, f"the call to model '{call.model_name}': {exc}")

    async def _pump(
        self, call: BlsCall, callers: tuple[Caller, ...]
    ) -> AsyncGenerator[BlsResult, None]:
        try:
            with _Watched(callers):
                parent = parent_context(callers, call.timeout_us)
                async for item in self._calls.stream_model(to_request(call), parent):
                    yield _item(item)
                    if item.final:
                        return
        except InferdError as exc:
            yield _failed(exc.kind, exc.message)
        except asyncio.CancelledError:
            yield _cancelled(call)
        except Exception as exc:
            log.exception("BLS stream from model '%s' failed", call.model_name)
            yield _failed(ErrorKind.INTERNAL, f"the call to model '{call.model_name}': {exc}")

    def _refuse_decoupled(self, call: BlsCall) -> None:
        try:
            decoupled = self._registry.get(call.model_name, call.model_version).decoupled
        except InferdError:
            return  # call_model gives the reason
        if decoupled:
            raise InferdError(
                ErrorKind.UNSUPPORTED,
                f"model '{call.model_name}' is decoupled: call it with exec(decoupled=True) "
                "and iterate its responses",
            )


def parent_context(callers: tuple[Caller, ...], timeout_us: int) -> CallContext:
    """The context the call inherits: of its one caller, or of a batch's (the latest
    deadline, so that no request's call is cut short by another's; the first trace);
    the call's own timeout tightens the deadline."""
    contexts = [c.ctx for c in callers if c.ctx is not None]
    if contexts:
        first = contexts[0]
        deadlines = [c.deadline_ns for c in contexts]
        deadline = None if None in deadlines else max(d for d in deadlines if d is not None)
        trace = next((c.traceparent for c in contexts if c.traceparent), "")
        ctx = CallContext(
            protocol=first.protocol,
            client=first.client,
            traceparent=trace,
            routing_key=first.routing_key,
            deadline_ns=deadline,
        )
    else:  # a warm-up sample, a thread of the model's own
        ctx = CallContext(protocol="bls")
    if timeout_us > 0:
        own = time.perf_counter_ns() + timeout_us * 1000
        ctx.deadline_ns = own if ctx.deadline_ns is None else min(ctx.deadline_ns, own)
    return ctx


class _Watched:
    """While the call runs: cancel it once every watched caller was given up on."""

    def __init__(self, callers: tuple[Caller, ...]) -> None:
        self._futures = [c.given_up for c in callers if c.given_up is not None]
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> None:
        if not self._futures:
            return
        self._task = asyncio.current_task()
        if self._all_done():
            raise asyncio.CancelledError  # given up before the call began
        for f in self._futures:
            f.add_done_callback(self._one_done)

    def __exit__(self, *exc: object) -> None:
        for f in self._futures:
            f.remove_done_callback(self._one_done)

    def _all_done(self) -> bool:
        return all(f.done() for f in self._futures)

    def _one_done(self, _: asyncio.Future[Any]) -> None:
        if self._all_done() and self._task is not None:
            self._task.cancel()


def to_request(call: BlsCall) -> InferRequest:
    inputs = [
        Tensor(name, v2_datatype(array.dtype, f"input '{name}'"), tuple(array.shape), array)
        for name, array in call.inputs.items()
    ]
    outputs = None if call.output_names is None else [RequestedOutput(n) for n in call.output_names]
    return InferRequest(
        call.model_name, call.model_version, inputs, call.request_id, outputs, call.parameters
    )


def _result(response: InferResponse, final: bool) -> BlsResult:
    return BlsResult(
        outputs={t.name: t.data for t in response.outputs},
        final=final,
        parameters=dict(response.parameters),
    )


def _item(item: StreamResponse) -> BlsResult:
    if item.error is not None:
        return BlsResult(None, item.error.kind.name, item.error.message, item.final)
    if item.response is None:  # the final flag alone
        return BlsResult(None, final=True)
    return _result(item.response, item.final)


def _failed(kind: ErrorKind, message: str) -> BlsResult:
    return BlsResult(None, kind.name, message)


def _cancelled(call: BlsCall) -> BlsResult:
    return BlsResult(
        None,
        "CANCELLED",
        f"the call to model '{call.model_name}' was cancelled: the request it was made "
        "for was given up on (its client left, or its deadline passed)",
    )


class _StreamReader:
    """The model's side of a decoupled call: it pulls items across to the server's loop,
    where `pump` runs a few items ahead of it at most."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pump: AsyncGenerator[BlsResult, None]
    ) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[BlsResult] = asyncio.Queue(STREAM_AHEAD)  # binds on use
        self._done = False
        self._closed = False
        self._task: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
            self._run(pump), loop
        )

    async def _run(self, pump: AsyncGenerator[BlsResult, None]) -> None:
        final = False
        async with contextlib.aclosing(pump):
            async for item in pump:
                if self._closed:  # the model stopped reading: nobody takes the rest
                    return
                final = item.final
                await self._queue.put(item)
        if not final:  # a stream that ended without its final flag: the model must not wait
            await self._queue.put(_failed(ErrorKind.INTERNAL, "the stream ended unfinished"))

    def __iter__(self) -> _StreamReader:
        return self

    def __next__(self) -> BlsResult:
        if self._done:
            raise StopIteration
        item = asyncio.run_coroutine_threadsafe(self._queue.get(), self._loop).result()
        self._done = item.final
        return item

    def close(self) -> None:
        """The model stops reading: the call ends (its pump is cancelled, and a thread
        still waiting in `__next__` wakes)."""
        self._done = self._closed = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to cancel
            self._task.cancel()
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if not self._queue.full():  # full: nobody waits for an item
            self._queue.put_nowait(BlsResult(None, "CANCELLED", "the stream was closed"))

    def __del__(self) -> None:
        if not self._done:
            self.close()
