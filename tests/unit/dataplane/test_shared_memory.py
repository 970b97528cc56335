"""The shared-memory table on real /dev/shm objects: keys, bounds, in-place views, leases."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory as mpshm
from pathlib import Path

import numpy as np
import pytest

from inferd.dataplane.shm_regions import SharedMemoryRegistry, shm_path
from inferd.errors import ErrorKind, InferdError
from inferd.tensors.wire_format import NO_DATA, shared_memory_ref
from inferd.types import InferRequest, RequestedOutput, SharedMemoryRef, Tensor


@pytest.fixture
def shm() -> Iterator[mpshm.SharedMemory]:
    """A 4096-byte POSIX shared-memory object, as a client would create it."""
    block = mpshm.SharedMemory(f"inferd_unit_{uuid.uuid4().hex[:12]}", create=True, size=4096)
    try:
        yield block
    finally:
        block.close()
        block.unlink()


def key_of(block: mpshm.SharedMemory) -> str:
    return "/" + block.name.lstrip("/")


def shm_request(inputs: list[Tensor], outputs: list[RequestedOutput] | None = None) -> InferRequest:
    return InferRequest("m", "", inputs, outputs=outputs, uses_shared_memory=True)


def fp32_input(region: str, n: int, offset: int = 0, byte_size: int | None = None) -> Tensor:
    size = 4 * n if byte_size is None else byte_size
    ref = SharedMemoryRef(region, size, offset)
    return Tensor("IN", "FP32", (1, n), NO_DATA, shared_memory=ref)


@pytest.mark.parametrize(
    "key",
    ["", "/", "..", "/..", ".", "a/b", "/a/b", "../etc/passwd", "/dev/shm/x", "x\0y", "n" * 256],
)
def test_a_key_is_a_shared_memory_name_never_a_path(key: str) -> None:
    with pytest.raises(InferdError) as info:
        shm_path(key)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "not a POSIX shared-memory name" in info.value.message


@pytest.mark.parametrize("key", ["/input0", "input0", "/a.b-c_d", "/" + "n" * 255])
def test_a_plain_name_maps_into_dev_shm(key: str) -> None:
    assert shm_path(key) == "/dev/shm/" + key.lstrip("/")


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"shared_memory_byte_size": 8}, ["need shared_memory_region"]),
        ({"shared_memory_offset": 8}, ["need shared_memory_region"]),
        ({"shared_memory_region": "r"}, ["'r' needs shared_memory_byte_size"]),
        ({"shared_memory_region": 5, "shared_memory_byte_size": 8}, ["non-empty string"]),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, ["byte_size", ">= 0"]),
        ({"shared_memory_region": "r", "shared_memory_byte_size": True}, ["byte_size"]),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": -4},
            ["shared_memory_offset", ">= 0"],
        ),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 8,
                "shared_memory_offset": "4",
            },
            ["shared_memory_offset"],
        ),
    ],
)
def test_malformed_parameters_name_the_parameter(
    params: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(InferdError) as info:
        shared_memory_ref(params, "input 'IN'")
    assert info.value.message.startswith("input 'IN': ")
    for word in words:
        assert word in info.value.message


def test_inputs_are_views_of_the_region_not_copies(shm: mpshm.SharedMemory) -> None:
    table = SharedMemoryRegistry()
    table.register("in", key_of(shm), 64, 1024)
    values = np.arange(8, dtype=np.float32)
    shm.buf[64 + 16 : 64 + 48] = values.tobytes()  # type: ignore[index]  # window offset 64, tensor offset 16
    request = shm_request([fp32_input("in", 8, offset=16)])
    lease = table.lease(request)
    data = request.inputs[0].data
    np.testing.assert_array_equal(data, values.reshape(1, 8))
    assert not data.flags.writeable  # a model cannot write into the client's memory
    # A write by the client shows through: the array reads the mapping itself.
    shm.buf[64 + 16 : 64 + 20] = np.float32(42.0).tobytes()  # type: ignore[index]
    assert data[0, 0] == 42.0
    lease.release()


def test_unregistering_a_region_in_use_keeps_it_mapped_until_released(
    shm: mpshm.SharedMemory,
) -> None:
    table = SharedMemoryRegistry()
    table.register("r", key_of(shm), 0, 4096)
    region = table.regions["r"]
    first = table.lease(shm_request([fp32_input("r", 4)]))
    second = table.lease(shm_request([fp32_input("r", 4)], [RequestedOutput("OUT")]))
    assert region.users == 2
    table.unregister("r")
    assert table.status() == []  # the name is free at once...
    assert region.is_mapped  # ...the mapping stays for the requests holding it
    first.release()
    assert region.is_mapped
    second.release()
    assert not region.is_mapped and region.users == 0
    table.register("r", key_of(shm), 0, 16)  # and the name can be registered again
    assert table.status("r") == [{"name": "r", "key": key_of(shm), "offset": 0, "byte_size": 16}]


def test_a_failing_lease_holds_nothing(shm: mpshm.SharedMemory) -> None:
    table = SharedMemoryRegistry()
    table.register("r", key_of(shm), 0, 64)
    request = shm_request([fp32_input("r", 4), fp32_input("missing", 4)])
    with pytest.raises(InferdError, match="unknown system shared memory region 'missing'"):
        table.lease(request)
    assert table.regions["r"].users == 0


def test_outputs_are_written_only_when_all_fit(shm: mpshm.SharedMemory) -> None:
    table = SharedMemoryRegistry()
    table.register("out", key_of(shm), 0, 4096)
    outputs = [
        RequestedOutput("A", shared_memory=SharedMemoryRef("out", 16, 0)),
        RequestedOutput("B", shared_memory=SharedMemoryRef("out", 4, 16)),
    ]
    lease = table.lease(shm_request([], outputs))
    produced = [
        Tensor("A", "FP32", (4,), np.full(4, 7.0, np.float32)),
        Tensor("B", "FP32", (4,), np.full(4, 8.0, np.float32)),  # 16 bytes into 4
    ]
    with pytest.raises(InferdError, match="output 'B' needs 16 bytes.*region 'out' is 4"):
        lease.write_outputs(produced)
    assert bytes(shm.buf[:16]) == bytes(16)  # type: ignore[index]  # A was not written either
    produced[1] = Tensor("B", "FP32", (1,), np.full(1, 8.0, np.float32))
    answered = lease.write_outputs(produced)
    assert [t.shared_memory for t in answered] == [o.shared_memory for o in outputs]
    assert all(t.data.size == 0 for t in answered)
    np.testing.assert_array_equal(np.frombuffer(shm.buf, np.float32, 5), [7, 7, 7, 7, 8])  # type: ignore[arg-type]
    lease.release()


def test_register_checks_the_object(shm: mpshm.SharedMemory, tmp_path: Path) -> None:
    table = SharedMemoryRegistry(max_regions=2)
    key = key_of(shm)
    with pytest.raises(InferdError, match="run past the 4096 bytes"):
        table.register("r", key, 4000, 100)
    with pytest.raises(InferdError, match="no shared memory object has key"):
        table.register("r", "/inferd_unit_no_such_object", 0, 8)
    link = f"inferd_unit_link_{uuid.uuid4().hex[:8]}"
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    os.symlink(target, f"/dev/shm/{link}")
    try:
        with pytest.raises(InferdError, match="symbolic link"):
            table.register("r", "/" + link, 0, 8)
    finally:
        os.unlink(f"/dev/shm/{link}")
    table.register("a", key, 0, 8)
    with pytest.raises(InferdError) as twice:
        table.register("a", key, 0, 8)
    assert twice.value.kind is ErrorKind.ALREADY_EXISTS
    table.register("b", key, 8, 8)
    with pytest.raises(InferdError, match="2 system shared memory regions are registered"):
        table.register("c", key, 16, 8)
    assert [r["name"] for r in table.status()] == ["a", "b"]


def test_bytes_inputs_are_copied_so_their_size_is_bounded(shm: mpshm.SharedMemory) -> None:
    table = SharedMemoryRegistry(max_copy_bytes=16)
    table.register("r", key_of(shm), 0, 64)
    shm.buf[:12] = b"\x08\0\0\0abcdefgh"  # type: ignore[index]
    small = Tensor("T", "BYTES", (1,), NO_DATA, shared_memory=SharedMemoryRef("r", 12))
    lease = table.lease(shm_request([small]))
    assert small.data.tolist() == [b"abcdefgh"]
    lease.release()
    large = Tensor("T", "BYTES", (1,), NO_DATA, shared_memory=SharedMemoryRef("r", 32))
    with pytest.raises(InferdError, match="its 32 bytes exceed the limit of 16"):
        table.lease(shm_request([large]))
    assert table.regions["r"].users == 0


@pytest.mark.parametrize(
    ("name", "key", "offset", "byte_size", "words"),
    [
        ("", "/k", 0, 8, "needs a non-empty name"),
        ("r", None, 0, 8, "'key' must be a string, got None"),
        ("r", "/k", "8", 8, "'offset' must be an integer >= 0, got '8'"),
        ("r", "/k", -1, 8, "'offset' must be an integer >= 0"),
        ("r", "/k", 0, 0, "'byte_size' must be an integer >= 1, got 0"),
        ("r", "/k", 0, True, "'byte_size' must be an integer >= 1, got True"),
    ],
)
def test_register_names_the_bad_field(
    name: str, key: object, offset: object, byte_size: object, words: str
) -> None:
    with pytest.raises(InferdError) as info:
        SharedMemoryRegistry().register(name, key, offset, byte_size)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert words in info.value.message
