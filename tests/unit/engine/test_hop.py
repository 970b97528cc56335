"""The hop between a front end and the engine: the slab allocator, tensors through a slab and
back, descriptors framed and coalesced, and a request through a real engine link (a real
DataPlane serving a real ONNX model) from the front end's `EngineClient`."""

from __future__ import annotations

import asyncio
import marshal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from inferd.dataplane.access import AccessPolicy
from inferd.dataplane.plane import DataPlane
from inferd.engine import hop
from inferd.engine.engine_client import EngineClient
from inferd.engine.engine_hop import EngineHop
from inferd.engine.model_table import ModelTable
from inferd.engine.slab import ALIGN, MIN_CLASS, Slab, SlabAllocator
from inferd.errors import ErrorKind, InferdError
from inferd.events import CallContext, Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.types import InferRequest, SharedMemoryRef, Tensor
from tests.support.models import builders


def test_the_allocator_hands_out_aligned_regions_and_reuses_freed_ones() -> None:
    a = SlabAllocator(4 * MIN_CLASS)
    first, second = a.alloc(1), a.alloc(MIN_CLASS + 1)  # classes MIN_CLASS and 2 * MIN_CLASS
    assert (first, second) == (0, MIN_CLASS)
    assert all(offset % ALIGN == 0 for offset in (first, second))
    assert a.alloc(MIN_CLASS) == 3 * MIN_CLASS
    assert a.alloc(1) == -1  # full: the caller sends the tensor inline
    a.free(second)
    assert a.alloc(2 * MIN_CLASS) == MIN_CLASS  # the freed region of that class, again
    a.free(first)
    assert a.alloc(MIN_CLASS - 1) == 0
    assert a.regions == 3 and a.used_bytes == 4 * MIN_CLASS


def test_tensors_cross_a_slab_in_place(tmp_path: Path) -> None:
    slab = Slab(tmp_path / "slab", 1 << 16, create=True)
    peer = Slab(tmp_path / "slab", 1 << 16)  # the other process's mapping of the same file
    allocator = SlabAllocator(slab.size)
    big = np.zeros((300, 100), np.float32)  # 120 KB: no room, goes inline
    tensors = [
        Tensor("x", "FP32", (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3), {"p": 1}),
        Tensor("s", "BYTES", (2,), np.array([b"a", b"bc"], dtype=object)),
        Tensor("big", "FP32", big.shape, big),
        Tensor("r", "INT32", (4,), np.empty(0, np.uint8), {}, SharedMemoryRef("reg", 16, 8)),
    ]
    regions: list[int] = []
    descs = hop.pack_tensors(tensors, slab, allocator, regions)
    assert [d[3] for d in descs] == [0, hop.INLINE_BYTES, hop.INLINE, hop.IN_REGION]
    assert regions == [0]
    back = hop.unpack_tensors(marshal.loads(marshal.dumps(descs)), peer)
    np.testing.assert_array_equal(back[0].data, tensors[0].data)
    assert back[0].parameters == {"p": 1}
    assert back[0].data.base is not None  # a view of the mapping, not a copy
    assert back[1].data.tolist() == [b"a", b"bc"]
    np.testing.assert_array_equal(back[2].data, big)
    assert back[3].shared_memory == SharedMemoryRef("reg", 16, 8)
    slab.unlink()


def test_descriptors_sent_in_one_turn_leave_in_one_write() -> None:
    class Transport(asyncio.WriteTransport):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[bytes] = []

        def write(self, data: bytes | bytearray | memoryview) -> None:
            self.writes.append(bytes(data))

        def is_closing(self) -> bool:
            return False

    async def scenario() -> tuple[list[bytes], list[tuple[object, ...]]]:
        transport = Transport()
        writer = hop.FrameWriter(transport)
        for i in range(3):
            writer.send((hop.CANCEL, i))
        await asyncio.sleep(0)  # one turn of the loop
        reader = hop.FrameReader()
        stream = transport.writes[0]
        # Delivered in odd pieces, as a socket may.
        messages = reader.feed(stream[:5]) + reader.feed(stream[5:])
        return transport.writes, messages

    writes, messages = asyncio.run(scenario())
    assert len(writes) == 1
    assert messages == [(hop.CANCEL, 0), (hop.CANCEL, 1), (hop.CANCEL, 2)]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", "n"]), root / "identity" / "1" / "model.onnx"
    )
    return root


def test_a_request_through_the_engine_link(repo: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = ModelRegistry(repo, Telemetry())
        table = ModelTable(registry.models)
        dataplane = DataPlane(registry, registry.telemetry, checked_signatures=table)
        await registry.load_all()
        engine = EngineHop(dataplane, table, tmp_path / "engine.sock")
        await engine.start()
        client = EngineClient(AccessPolicy(), tmp_path / "engine.sock", tmp_path, 1 << 20)
        await client.connect()
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        request = InferRequest("identity", "", [Tensor("INPUT0", "FP32", (2, 4), x)], id="r1")
        ctx = CallContext("http")
        with client.start("identity", "", ctx) as call:
            client.admit(call)
            response = await client.infer(call, request)
            np.testing.assert_array_equal(response.outputs[0].data, x)
            assert (response.id, response.model_version) == ("r1", "1")
        # The engine's error, raised again here as the same kind and message.
        with client.start("nope", "", ctx) as call, pytest.raises(InferdError) as raised:
            await client.infer(call, InferRequest("nope", "", []))
        with pytest.raises(InferdError) as direct:
            dataplane.registry.get("nope", "")
        assert (raised.value.kind, raised.value.message) == (
            ErrorKind.NOT_FOUND,
            direct.value.message,
        )
        # Every region is back: the inputs once answered, the outputs once encoded.
        link = next(iter(engine.links))
        await asyncio.wait_for(_until(lambda: link.allocator.regions == 0), 5)
        assert client._allocator.regions == 0
        # The engine goes: the front end answers UNAVAILABLE at once, before reading a body.
        await engine.close()
        await asyncio.wait_for(_disconnected(client), 5)
        with client.start("identity", "", ctx) as call, pytest.raises(InferdError) as gone:
            client.admit(call)
        assert gone.value.kind is ErrorKind.UNAVAILABLE
        client.close()
        await registry.unload_all()

    asyncio.run(scenario())


async def _disconnected(client: EngineClient) -> None:
    await _until(lambda: not client.connected.is_set())


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)
