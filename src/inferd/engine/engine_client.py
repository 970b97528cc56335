"""The front end's side of the hop: `EngineClient`, the unary steps of the DataPlane
(`start`, `admit`, `infer`, `respond`), run in the engine.

The adapters (protocol/http/infer_route.py, protocol/grpc/model_infer.py) call it exactly as they
call
the DataPlane in one process: the front end decodes the wire format, the client writes the
input tensors into its request slab and sends a descriptor; the engine's answer comes back
as tensors read in place from the response slab, which the adapter encodes. An error in the
engine comes back as the same `InferdError` (kind and message), so both answer alike.

Before the hop, each request is checked against its model's signature here, with the engine's
own code (model_table.py: the table the engine pushes): a bad request's tensors never cross
it. A request found malformed here (its body, a header, the signature) is answered as one
process answers it, where admission comes before the body is read: the front end asks the
engine (a small REFUSED note, answered at once), which runs its admission on it, counts it,
and says which error is the answer: a shed (429) or unavailable (503) first, else the front
end's own (400). At most MAX_REFUSALS notes are unanswered by the engine (a client that
leaves takes no note back); past that (a flood of bad requests, an engine that does not
read) a malformed request is answered its own error at once and counted as dropped, so a
flood never grows a front end's memory.

While no engine is connected (starting, restarting after a crash) every request fails at
once with UNAVAILABLE (HTTP 503): never a hang. A request whose engine dies before answering
fails the same way; one that was accepted always gets exactly one answer.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from inferd.dataplane.access import AccessPolicy
from inferd.engine import hop
from inferd.engine.model_table import FrontTable
from inferd.engine.slab import DEFAULT_SLAB_BYTES, Slab, SlabAllocator
from inferd.errors import InferdError, unavailable
from inferd.events import CallContext
from inferd.types import InferRequest, InferResponse

log = logging.getLogger("inferd.engine")

RECONNECT_S = 0.05  # between attempts to reach an engine that is (re)starting
MAX_REFUSALS = 64  # REFUSED notes awaiting the engine's answer, at most
_ENGINE_GONE = "the engine process is restarting; retry in a moment"


class FrontCall:
    """One unary request on its way through the engine (what `EngineClient.start` returns).
    Its `with` ends once the adapter has encoded the answer: the response's slab regions
    go back to the engine then."""

    __slots__ = ("_client", "ctx", "model_name", "released", "version")

    def __init__(self, client: EngineClient, model_name: str, version: str, ctx: CallContext):
        self._client = client
        self.model_name = model_name
        self.version = version
        self.ctx = ctx
        self.released: list[int] = []  # response regions to hand back

    def __enter__(self) -> Self:
        self._client.inflight += 1
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client.inflight -= 1
        if self.released:
            self._client.release(self.released)


# A request sent, by seq: the future its answer resolves, and its input regions in the
# request slab (free again once the engine answers). A tuple: made per request.
_Pending = tuple[asyncio.Future[tuple[Any, ...]], list[int]]


class EngineClient(asyncio.Protocol):
    def __init__(
        self,
        access: AccessPolicy,
        socket_path: Path,
        slab_directory: Path,
        slab_bytes: int = DEFAULT_SLAB_BYTES,
        index: int = 0,
    ) -> None:
        self._access = access
        # The first step, `start(model_name, version, ctx)`: the call itself, made without a
        # forwarding call (as the DataPlane binds its parts' steps).
        self.start: Callable[[str, str, CallContext], FrontCall] = functools.partial(
            FrontCall, self
        )
        self.index = index  # which front end this is (its metrics' `front_end` label)
        self.refused = 0  # requests answered 503 here for want of an engine
        # Malformed requests: the notes the engine has not answered yet (by seq: a client
        # that leaves does not take its note out of the hop), and those answered here alone
        # (their note dropped: MAX_REFUSALS were unanswered); how many of those the engine
        # has been told.
        self.refusals_unanswered: set[int] = set()
        self.refusals_dropped = 0
        self._dropped_told = 0
        self.table = FrontTable()  # the engine's signatures, as of its latest push
        self.socket_path = socket_path
        self.slab_directory = slab_directory
        self.slab_bytes = slab_bytes
        self.is_shutting_down = False
        self.inflight = 0
        self.connected = asyncio.Event()
        self._seq = itertools.count()
        self._pending: dict[int, _Pending] = {}
        self._link: tuple[asyncio.Transport, hop.FrameWriter, Slab, Slab] | None = None
        self._allocator = SlabAllocator(0)
        self._reader = hop.FrameReader()
        self._connections = itertools.count()
        self._reconnect: asyncio.Task[None] | None = None
        self.engine_restarts_seen = 0

    @property
    def access(self) -> AccessPolicy:
        return self._access

    # -- the link ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect (retrying while the engine starts); new slabs for each connection, so an
        old engine's writes can never land in what this connection reads."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                raw, _ = await loop.create_unix_connection(lambda: self, str(self.socket_path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                await asyncio.sleep(RECONNECT_S)
        transport = raw
        n = next(self._connections)
        stem = f"inferd-fe{os.getpid()}-{n}"
        requests = Slab(self.slab_directory / f"{stem}-req", self.slab_bytes, create=True)
        responses = Slab(self.slab_directory / f"{stem}-resp", self.slab_bytes, create=True)
        writer = hop.FrameWriter(transport)
        counts = {
            "refused": self.refused,
            "engine_lost": self.engine_restarts_seen,
            "refusals_dropped": self.refusals_dropped,
        }
        self._dropped_told = self.refusals_dropped
        hello = (hop.HELLO, str(requests.path), requests.size, str(responses.path), responses.size)
        writer.send((*hello, self.index, counts))
        self._allocator = SlabAllocator(self.slab_bytes)
        self._reader = hop.FrameReader()
        self._link = (transport, writer, requests, responses)
        self.connected.set()

    def connection_lost(self, exc: Exception | None) -> None:
        link, self._link = self._link, None
        self.connected.clear()
        self.table.clear()
        if link is not None:
            link[2].unlink()
            link[3].unlink()
        pending, self._pending = self._pending, {}
        self.refusals_unanswered.clear()
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(unavailable(_ENGINE_GONE))
        if not self.is_shutting_down:
            self.engine_restarts_seen += 1
            log.warning("the engine went away; answering 503 until it is back")
            self._reconnect = asyncio.get_running_loop().create_task(self.connect())

    def data_received(self, data: bytes) -> None:
        link = self._link
        if link is None:
            return
        for message in self._reader.feed(data):
            if message[0] == hop.TABLE:
                self.table.update(message[1])
                continue
            p = self._pending.pop(message[1], None)
            if p is None:
                continue
            future, regions = p
            if message[0] != hop.ANSWER:  # FAILED, or REFUSED: maybe a note's answer
                self._refusal_answered(message[1])
            for offset in regions:  # the engine is done reading the inputs
                self._allocator.free(offset)
            if not future.done():
                future.set_result(message)
            elif message[0] == hop.ANSWER:  # answered after the client left: hand back
                self.release(message[7])

    def close(self) -> None:
        self.is_shutting_down = True
        if self._reconnect is not None:
            self._reconnect.cancel()
        if self._link is not None:
            self._link[0].close()

    def release(self, regions: list[int]) -> None:
        if self._link is not None:
            self._link[1].send((hop.RELEASE, regions))

    # -- the steps (`start`, bound in __init__) ----------------------------------------------

    def admit(self, call: FrontCall) -> None:
        """Refused at once, before the body is read, while there is no engine to serve it."""
        if self.is_shutting_down:
            raise unavailable("the server is shutting down; retry on another replica")
        if self._link is None:
            self.refused += 1
            raise unavailable(_ENGINE_GONE)

    async def infer(self, call: FrontCall, request: InferRequest) -> InferResponse:
        link = self._link
        if link is None:
            raise unavailable(_ENGINE_GONE)
        _, writer, requests, responses = link
        try:
            request.signature_generation = self.table.check(request)  # raises as the engine would
        except InferdError as exc:
            raise await self.refusal(call, exc, request.id) from None
        seq = next(self._seq)
        regions: list[int] = []
        try:
            inputs = hop.pack_tensors(request.inputs, requests, self._allocator, regions)
        except BaseException:
            for offset in regions:
                self._allocator.free(offset)
            raise
        future: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._pending[seq] = (future, regions)
        writer.send(hop.request_message(seq, request, call.ctx, inputs))
        try:
            message = await future
        except asyncio.CancelledError:
            # The client left: the engine takes it out of its queue, and still answers (then
            # the regions are free again).
            if self._link is link:
                writer.send((hop.CANCEL, seq))
            raise
        if message[0] == hop.FAILED:
            raise hop.error_from(message)
        response = hop.response_from(message, responses)
        call.released = message[7]
        return response

    async def refusal(self, call: FrontCall, exc: InferdError, request_id: str = "") -> InferdError:
        """The error to answer a request found malformed here with: admission's, if the
        engine refuses it now (as one process refuses it before reading its body), else
        `exc`; the engine counts it. `exc` at once, counted in `refusals_dropped`, while
        MAX_REFUSALS notes are unanswered (whether their clients still wait or not)."""
        link = self._link
        if link is None:
            return unavailable(_ENGINE_GONE)  # admission here: no engine
        unanswered = self.refusals_unanswered
        if len(unanswered) >= MAX_REFUSALS:
            self.refusals_dropped += 1
            return exc
        writer = link[1]
        seq = next(self._seq)
        future: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._pending[seq] = (future, [])
        unanswered.add(seq)
        writer.send(
            hop.refused_message(seq, call.model_name, call.version, call.ctx, request_id, exc)
        )
        try:
            message = await future
        except InferdError as gone:  # the engine went away meanwhile
            return gone
        return exc if message[0] == hop.REFUSED else hop.error_from(message)

    def _refusal_answered(self, seq: int) -> None:
        """A note's answer came (its client may have left): one more may go; the engine is
        told of the requests answered here alone meanwhile."""
        unanswered = self.refusals_unanswered
        if seq not in unanswered:
            return
        unanswered.discard(seq)
        link = self._link
        if link is not None and self.refusals_dropped != self._dropped_told:
            self._dropped_told = self.refusals_dropped
            link[1].send((hop.DROPPED, self.refusals_dropped))

    def respond(self, call: FrontCall, response: InferResponse) -> InferResponse:
        return response  # the engine's DataPlane.respond checked it already
