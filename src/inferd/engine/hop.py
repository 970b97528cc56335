"""The hop between a front end and the engine: tensors in shared memory, small descriptors
over a unix socket.

A descriptor is a tuple of plain values (str, int, float, bytes, dict, list) serialised with
`marshal` (C speed, nothing executed on load; both ends are the same interpreter) behind a
4-byte length. Tensors never travel in it: a fixed-size tensor is written once into the
sender's slab and the descriptor says where (the receiver reads it in place); only BYTES
tensors, and a tensor that finds no room in the slab, travel inline. Descriptors that are
ready in the same turn of the event loop leave in one write (`FrameWriter`).

Messages (the first item says which):
    HELLO    front end -> engine   (HELLO, request slab path, size, response slab path, size,
                                    front end index, {counter: value} of what it did alone)
    REQUEST  front end -> engine   (REQUEST, seq, model, version, ctx, request fields, inputs,
                                    the signature generation it was checked against, 0: none)
    CANCEL   front end -> engine   (CANCEL, seq): the client left; the request leaves its queue
    RELEASE  front end -> engine   (RELEASE, [offset, ...]): response regions read and encoded
    ANSWER   engine -> front end   (ANSWER, seq, model, version, id, parameters, outputs,
                                    [offset, ...]: the outputs' regions, to RELEASE)
    FAILED   engine -> front end   (FAILED, seq, ErrorKind value, message)
    TABLE    engine -> front end   (TABLE, {model: entry}): the signatures a front end checks
                                    requests against (model_table.py); sent after the HELLO
                                    and again on every change of the models' versions
    REFUSED  front end -> engine   (REFUSED, seq, model, version, ctx, request id, ErrorKind
                                    value, message): a request the front end found malformed
                                    (its body, a header, the signature), no tensors; the
                                    engine meets it as one process would, admission first,
                                    counts it as one process counts a failed request
                                    (statistics, metrics, log), and answers
             engine -> front end   (REFUSED, seq): answer your own error, or
                                   (FAILED, seq, ...): admission's refusal instead
    DROPPED  front end -> engine   (DROPPED, count): the malformed requests this front end has
                                    answered alone so far (too many REFUSED awaiting answers)
"""

from __future__ import annotations

import asyncio
import marshal
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from inferd.datatypes import V2_TO_NUMPY
from inferd.engine.slab import Slab, SlabAllocator
from inferd.errors import ErrorKind, InferdError
from inferd.events import CallContext
from inferd.tensors.wire_format import NO_DATA
from inferd.types import InferRequest, InferResponse, RequestedOutput, SharedMemoryRef, Tensor

HELLO, REQUEST, CANCEL, RELEASE, ANSWER, FAILED, TABLE, REFUSED, DROPPED = range(9)

_LENGTH = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a descriptor with inline tensors; past it the peer is broken

# Where a tensor's data is (a descriptor's fourth item when not an offset >= 0).
INLINE = -1  # its raw bytes in the descriptor (no room in the slab)
INLINE_BYTES = -2  # a BYTES tensor: its elements, as a list, in the descriptor
IN_REGION = -3  # a client's shared-memory region (the engine resolves it)

TensorDesc = tuple[Any, ...]


class HopClosedError(ConnectionError):
    """The other side of the hop went away."""


# -- tensors ---------------------------------------------------------------------------------


def pack_tensors(
    tensors: Iterable[Tensor], slab: Slab, allocator: SlabAllocator, regions: list[int]
) -> list[TensorDesc]:
    """Descriptors of `tensors`, their data written into `slab`; each region allocated is
    appended to `regions` (the caller frees them once the peer is done)."""
    out: list[TensorDesc] = []
    for t in tensors:
        ref = t.shared_memory
        shm = None if ref is None else (ref.region, ref.byte_size, ref.offset)
        data = t.data
        if ref is not None and data.size == 0:
            out.append((t.name, t.datatype, t.shape, IN_REGION, None, t.parameters, shm))
        elif t.datatype == "BYTES" or data.dtype.kind in "OSU":
            out.append(
                (t.name, t.datatype, t.shape, INLINE_BYTES, _elements(data), t.parameters, shm)
            )
        else:
            offset = allocator.alloc(data.nbytes) if data.nbytes else -1
            if offset < 0:  # no room (or nothing to write): the bytes go inline
                raw = np.ascontiguousarray(data, V2_TO_NUMPY[t.datatype]).tobytes()
                out.append((t.name, t.datatype, t.shape, INLINE, raw, t.parameters, shm))
            else:
                slab.write(offset, data.astype(V2_TO_NUMPY[t.datatype], copy=False))
                regions.append(offset)
                out.append((t.name, t.datatype, t.shape, offset, None, t.parameters, shm))
    return out


def unpack_tensors(descs: list[TensorDesc], slab: Slab) -> list[Tensor]:
    """Tensors over `slab` (read in place) from their descriptors."""
    tensors = []
    for name, datatype, shape, where, payload, parameters, shm in descs:
        ref = None if shm is None else SharedMemoryRef(*shm)
        if where >= 0:
            data = slab.view(where, V2_TO_NUMPY[datatype], shape)
        elif where == INLINE:
            data = np.frombuffer(payload, V2_TO_NUMPY[datatype]).reshape(shape)
        elif where == INLINE_BYTES:
            data = np.empty(len(payload), dtype=object)
            data[:] = payload
            data = data.reshape(shape)
        else:
            data = NO_DATA
        tensors.append(Tensor(name, datatype, tuple(shape), data, parameters, ref))
    return tensors


def _elements(data: Any) -> list[Any]:
    """A BYTES tensor's elements as a flat list of bytes (or str) that marshal can carry."""
    flat: list[Any] = data.reshape(-1).tolist()
    try:
        marshal.dumps(flat)
    except ValueError:  # numpy scalar subclasses: plain bytes
        flat = [x if type(x) in (bytes, str) else bytes(x) for x in flat]
    return flat


# -- requests and answers --------------------------------------------------------------------


def request_message(
    seq: int, request: InferRequest, ctx: CallContext, inputs: list[TensorDesc]
) -> tuple[Any, ...]:
    outputs = (
        None
        if request.outputs is None
        else [
            (o.name, o.parameters, None if o.shared_memory is None else _ref(o.shared_memory))
            for o in request.outputs
        ]
    )
    return (
        REQUEST, seq, request.model_name, request.model_version, _context(ctx), request.id,
        request.parameters, outputs, request.uses_shared_memory, inputs,
        request.signature_generation,
    )  # fmt: skip


def _context(ctx: CallContext) -> tuple[Any, ...]:
    return (
        ctx.protocol, ctx.client, ctx.traceparent, ctx.wall_start_s, ctx.start_ns,
        ctx.routing_key, ctx.deadline_ns,
    )  # fmt: skip


# A REFUSED note carries at most this much of the client's text (the error's message, which
# may quote it, and the request id): more than the log keeps of either (log_safety.py).
NOTE_MESSAGE_CHARS = 2048
NOTE_ID_CHARS = 256


def refused_message(
    seq: int, model: str, version: str, ctx: CallContext, request_id: str, exc: InferdError
) -> tuple[Any, ...]:
    return (
        REFUSED, seq, model, version, _context(ctx), request_id[:NOTE_ID_CHARS], exc.kind.value,
        exc.message[:NOTE_MESSAGE_CHARS],
    )  # fmt: skip


def refusal_from(message: tuple[Any, ...]) -> tuple[int, str, str, CallContext, str, InferdError]:
    """The engine's side of `refused_message`: (seq, model, version, ctx, request id, the
    error). The context's start is the front end's: the clock is the machine's (monotonic)."""
    _, seq, model, version, context, rid, kind, text = message
    return seq, model, version, CallContext(*context), rid, InferdError(ErrorKind(kind), text)


def request_from(message: tuple[Any, ...], slab: Slab) -> tuple[int, InferRequest, CallContext]:
    """The engine's side of `request_message`: (seq, request with inputs in place, ctx)."""
    _, seq, model, version, context, rid, parameters, outputs, uses_shm, inputs, checked = message
    ctx = CallContext(*context)
    requested = (
        None
        if outputs is None
        else [
            RequestedOutput(n, p, None if s is None else SharedMemoryRef(*s)) for n, p, s in outputs
        ]
    )
    request = InferRequest(
        model,
        version,
        unpack_tensors(inputs, slab),
        rid,
        requested,
        parameters,
        uses_shm,
        inputs_borrowed=True,  # views of the front end's slab, reused once answered
        signature_generation=checked,
    )
    return seq, request, ctx


def answer_message(
    seq: int, response: InferResponse, outputs: list[TensorDesc], regions: list[int]
) -> tuple[Any, ...]:
    """`regions`: those `pack_tensors` allocated for `outputs`, which the front end hands back
    once it has encoded them (it need not pick them out of the descriptors)."""
    parameters = response.parameters
    if parameters and not all(type(v) in _PLAIN for v in parameters.values()):
        # A Python model's response parameters may hold numpy scalars: their plain value.
        parameters = {k: v.item() if hasattr(v, "item") else v for k, v in parameters.items()}
    return (
        ANSWER, seq, response.model_name, response.model_version, response.id,
        parameters, outputs, regions,
    )  # fmt: skip


_PLAIN = frozenset({str, int, float, bool, type(None)})


def response_from(message: tuple[Any, ...], slab: Slab) -> InferResponse:
    _, _, model, version, rid, parameters, outputs, _ = message
    return InferResponse(model, version, unpack_tensors(outputs, slab), rid, parameters)


def failure_message(seq: int, exc: InferdError) -> tuple[Any, ...]:
    return (FAILED, seq, exc.kind.value, exc.message)


def error_from(message: tuple[Any, ...]) -> InferdError:
    """The engine's error, raised again in the front end: the adapters answer it exactly as
    one process would (same kind, same message)."""
    return InferdError(ErrorKind(message[2]), message[3])


def _ref(ref: SharedMemoryRef) -> tuple[str, int, int]:
    return (ref.region, ref.byte_size, ref.offset)


# -- frames ----------------------------------------------------------------------------------


class FrameWriter:
    """Length-prefixed descriptors onto a transport; those sent in one turn of the event loop
    leave together, in one write."""

    __slots__ = ("_loop", "_pending", "transport")

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def send(self, message: tuple[Any, ...]) -> None:
        payload = marshal.dumps(message)
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending += (_LENGTH.pack(len(payload)), payload)

    def flush(self) -> None:
        if self._pending and not self.transport.is_closing():
            self.transport.write(b"".join(self._pending))
        self._pending.clear()


class FrameReader:
    """Bytes from the socket in, whole descriptors out."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        buffer = self._buffer
        buffer += data
        messages = []
        start, end = 0, len(buffer)
        while end - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size > MAX_FRAME:
                raise HopClosedError(f"a descriptor of {size} bytes: the peer is broken")
            if end - start - 4 < size:
                break
            messages.append(marshal.loads(memoryview(buffer)[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return messages
