"""The engine's end of the hop: a unix socket that front ends connect to, each request run
through the DataPlane's own steps (dataplane/unary.py), as if it had come in over HTTP or gRPC.

Inputs are read in place from the front end's request slab; outputs are written once into
its response slab. Every request gets exactly one answer (ANSWER or FAILED), a cancelled one
included: only then does the front end reuse the request's slab regions.

Each front end gets the model table (model_table.py) after its hello and again whenever the
registry changes what serves, so it checks requests against the signatures before the hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, cast

from inferd.dataplane.plane import DataPlane
from inferd.engine import hop
from inferd.engine.model_table import ModelTable
from inferd.engine.slab import Slab, SlabAllocator
from inferd.errors import ErrorKind, InferdError, unavailable

log = logging.getLogger("inferd.engine")


class EngineHop:
    """The listening socket; one `_FrontEndLink` per connected front end."""

    def __init__(self, dataplane: DataPlane, table: ModelTable, path: Path) -> None:
        """`table`: the DataPlane's `checked_signatures`, pushed to every front end."""
        self.dataplane = dataplane
        self.path = path
        self.links: set[_FrontEndLink] = set()
        # Per front end index, for the metrics (engine/front_end_series.py): infer requests taken,
        # and what each front end reported at its last hello (its own 503s, engine losses).
        self.requests: dict[int, int] = {}
        self.reported: dict[int, dict[str, int]] = {}
        self.invalid: dict[int, int] = {}  # requests a front end refused on the signature
        self._server: asyncio.AbstractServer | None = None
        self.table = table
        self.table.refresh()
        dataplane.registry.changed = self._models_changed

    def _models_changed(self) -> None:
        table = self.table.refresh()
        for link in self.links:
            link.send_table(table)

    def front_end_refused(self, front_end: int, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """A request a front end found malformed (its body, a header, the signature), met as
        one process meets it: admission first, as if its body were unread (shutting down,
        --max-inflight-requests, a full queue, an unknown model...), then the front end's
        error; told to telemetry as one process tells its failed request (statistics,
        metrics, the request log; no inputs). The answer for the front end: its own error
        (REFUSED), or admission's refusal (FAILED)."""
        seq, model, version, ctx, request_id, exc = hop.refusal_from(message)
        self.invalid[front_end] = self.invalid.get(front_end, 0) + 1
        dp = self.dataplane
        try:
            with dp.start(model, version, ctx) as call:
                call.record.request_id = request_id
                dp.admit(call)
                if request_id:  # refused on the signature: where one process routed it
                    with contextlib.suppress(InferdError):  # (gone meanwhile: admit's)
                        routed = dp.registry.get(model, version, ctx.routing_key or request_id)
                        call.record.version = routed.version
                raise exc
        except InferdError as answer:
            if answer is exc:
                return (hop.REFUSED, seq)
            return hop.failure_message(seq, answer)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.path.unlink(missing_ok=True)  # a dead engine's socket file
        self._server = await loop.create_unix_server(lambda: _FrontEndLink(self), str(self.path))

    async def close(self) -> None:
        """Stop taking front ends (they see the socket close and answer 503 until an engine
        is back); the links' requests have drained by now (front ends stop first)."""
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.close()
        self.path.unlink(missing_ok=True)


class _FrontEndLink(asyncio.Protocol):
    def __init__(self, owner: EngineHop) -> None:
        self.owner = owner
        self.dp = owner.dataplane
        self.reader = hop.FrameReader()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.requests: Slab | None = None
        self.responses: Slab | None = None
        self.allocator = SlabAllocator(0)
        self.transport: asyncio.Transport | None = None
        self.front_end = -1  # its index, from its hello

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.writer = hop.FrameWriter(self.transport)
        self.owner.links.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.reader.feed(data)
        except hop.HopClosedError as exc:
            log.error("front end link: %s; closing it", exc)
            self.close()
            return
        for message in messages:
            kind = message[0]
            if kind == hop.REQUEST:
                seq = message[1]
                self.tasks[seq] = asyncio.create_task(self._serve(seq, message))
                requests = self.owner.requests
                requests[self.front_end] = requests.get(self.front_end, 0) + 1
            elif kind == hop.RELEASE:
                for offset in message[1]:
                    self.allocator.free(offset)
            elif kind == hop.REFUSED:
                self.writer.send(self.owner.front_end_refused(self.front_end, message))
            elif kind == hop.DROPPED:
                self.owner.reported.setdefault(self.front_end, {})["refusals_dropped"] = message[1]
            elif kind == hop.CANCEL:
                task = self.tasks.get(message[1])
                if task is not None:
                    task.cancel()
            elif kind == hop.HELLO:
                _, request_path, request_size, response_path, response_size = message[:5]
                self.front_end, self.owner.reported[self.front_end] = message[5:7]
                self.requests = Slab(Path(request_path), request_size)
                self.responses = Slab(Path(response_path), response_size)
                # Both ends have them mapped: the files can go, so no crash leaves one in
                # /dev/shm (the mappings live until both processes drop them).
                self.requests.unlink()
                self.responses.unlink()
                self.allocator = SlabAllocator(response_size)
                self.send_table(self.owner.table.message)

    def connection_lost(self, exc: Exception | None) -> None:
        # The front end died (or stopped): its clients are gone with it.
        for task in self.tasks.values():
            task.cancel()
        self.owner.links.discard(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def send_table(self, table: dict[str, Any]) -> None:
        """At once, not with the next turn's writes: the answer to a repository call that
        changed it must not reach a client before its front ends have the new table."""
        self.writer.send((hop.TABLE, table))
        self.writer.flush()

    async def _serve(self, seq: int, message: tuple[Any, ...]) -> None:
        dp = self.dp
        try:
            if self.requests is None or self.responses is None:
                raise InferdError(ErrorKind.INTERNAL, "a request before the front end's hello")
            _, request, ctx = hop.request_from(message, self.requests)
            with dp.start(request.model_name, request.model_version, ctx) as call:
                dp.admit(call)
                response = dp.respond(call, await dp.infer(call, request))
                regions: list[int] = []
                try:
                    outputs = hop.pack_tensors(
                        response.outputs, self.responses, self.allocator, regions
                    )
                    answer = hop.answer_message(seq, response, outputs, regions)
                except BaseException:
                    for offset in regions:
                        self.allocator.free(offset)
                    raise
            self.writer.send(answer)
        except InferdError as exc:
            self.writer.send(hop.failure_message(seq, exc))
        except asyncio.CancelledError:
            # The front end's client left (or the front end is gone): answered all the same,
            # so the front end knows the request's slab regions are free again.
            self.writer.send(hop.failure_message(seq, unavailable("the request was cancelled")))
        except Exception:
            log.exception("request %d from a front end failed", seq)
            failure = InferdError(ErrorKind.INTERNAL, "internal error in the engine")
            self.writer.send(hop.failure_message(seq, failure))
        finally:
            self.tasks.pop(seq, None)
