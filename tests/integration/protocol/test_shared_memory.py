"""System shared memory over HTTP and gRPC, with Triton's clients and their shm utilities.

Every case runs over both protocols: the region table, the bounds checks and the reads and
writes are the core's, so each must behave (and fail) the same way over either.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.support.fault_models import GATED, blocker_is_executing, write_gated_counter
from tests.support.models import builders
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, batcher_of, run_server, wait_for


def _add_model() -> Any:
    """SUM = A + B, DIFF = A - B: two inputs, so some can travel in shared memory and some not."""
    dims: list[str | int] = ["batch", 4]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["A", "B"], ["SUM"]),
            helper.make_node("Sub", ["A", "B"], ["DIFF"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("A", "B")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("SUM", "DIFF")],
    )
    return builders._ir(graph)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shm_gate") / "closed"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("shm_repo")
    builders._save(builders.identity(TensorProto.FLOAT, ["batch", "n"]), repo / "fp32/1/model.onnx")
    builders._save(
        builders.identity(TensorProto.STRING, ["batch", "n"]), repo / "text/1/model.onnx"
    )
    builders._save(_add_model(), repo / "add_sub" / "1" / "model.onnx")
    write_gated_counter(repo, gate)
    # A 1 MiB body limit: tensors in shared memory never travel in the body.
    with run_server(repo, max_request_bytes=1024 * 1024) as running:
        yield running


class ShmClient(Client):
    """A Triton client of either protocol, with its shared-memory calls."""

    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self.raw.register_system_shared_memory(name, key, byte_size, offset=offset)

    def unregister(self, name: str = "") -> None:
        self.raw.unregister_system_shared_memory(name)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if self.protocol == "http":
            return list(self.raw.get_system_shared_memory_status(name))
        regions = self.raw.get_system_shared_memory_status(name, as_json=True).get("regions", {})
        return [  # protobuf's JSON writes 64-bit integers as strings, and leaves out zeros
            {
                "name": r["name"],
                "key": r["key"],
                "offset": int(r.get("offset", 0)),
                "byte_size": int(r["byte_size"]),
            }
            for r in regions.values()
        ]

    def infer_shm(
        self,
        model: str,
        inputs: dict[str, tuple[str, list[int], Any]],
        outputs: dict[str, tuple[str, int, int] | None],
    ) -> Any:
        """`inputs`: name -> (datatype, shape, an array or (region, byte_size, offset));
        `outputs`: name -> (region, byte_size, offset), or None to receive it inline."""
        made = []
        for name, (datatype, shape, source) in inputs.items():
            inp = self.mod.InferInput(name, shape, datatype)
            if isinstance(source, np.ndarray):
                inp.set_data_from_numpy(source)
            else:
                inp.set_shared_memory(*source)
            made.append(inp)
        requested = []
        for name, target in outputs.items():
            out = self.mod.InferRequestedOutput(name)
            if target is not None:
                out.set_shared_memory(*target)
            requested.append(out)
        return self.raw.infer(model, made, outputs=requested)


@dataclass
class Objects:
    """The client's shared-memory objects of one test, destroyed after it."""

    handles: list[Any] = field(default_factory=list)

    def create(self, byte_size: int) -> tuple[Any, str]:
        key = f"/inferd_test_{uuid.uuid4().hex[:16]}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, byte_size)
        self.handles.append(handle)
        return handle, key


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[ShmClient]:
    c = ShmClient(request.param, server)
    yield c
    c.unregister()  # every test starts with no region registered
    c.raw.close()


@pytest.fixture
def objects() -> Iterator[Objects]:
    made = Objects()
    yield made
    for handle in made.handles:
        shm.destroy_shared_memory_region(handle)


def f32(*shape: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(np.prod(shape), dtype=np.float32) + start).reshape(shape)


TEXT = np.array(
    [[b"alpha", b"", "béta".encode()], [b"gamma delta", "ω".encode(), b"z"]], dtype=object
)
A, B = f32(2, 4, start=1), f32(2, 4, start=100)

# (id, model, inputs: name -> (datatype, value, in shared memory?),
#  outputs: name -> (expected value, in shared memory?))
ROUND_TRIPS: list[tuple[str, str, dict[str, tuple[str, np.ndarray, bool]], dict[str, Any]]] = [
    (
        "fp32 in and out",
        "fp32",
        {"INPUT0": ("FP32", f32(2, 7), True)},
        {"OUTPUT0": (f32(2, 7), True)},
    ),
    (
        "fp32 in only",
        "fp32",
        {"INPUT0": ("FP32", f32(3, 5), True)},
        {"OUTPUT0": (f32(3, 5), False)},
    ),
    (
        "fp32 out only",
        "fp32",
        {"INPUT0": ("FP32", f32(1, 9), False)},
        {"OUTPUT0": (f32(1, 9), True)},
    ),
    ("bytes in and out", "text", {"INPUT0": ("BYTES", TEXT, True)}, {"OUTPUT0": (TEXT, True)}),
    (
        "first of two inputs, both outputs",
        "add_sub",
        {"A": ("FP32", A, True), "B": ("FP32", B, False)},
        {"SUM": (A + B, True), "DIFF": (A - B, True)},
    ),
    (
        "second of two inputs, one output",
        "add_sub",
        {"A": ("FP32", A, False), "B": ("FP32", B, True)},
        {"SUM": (A + B, False), "DIFF": (A - B, True)},
    ),
]


def _nbytes(datatype: str, value: np.ndarray) -> int:
    if datatype == "BYTES":
        return len(serialize_byte_tensor(value).item())
    return int(value.nbytes)


@pytest.mark.parametrize(
    ("model", "inputs", "outputs"), [c[1:] for c in ROUND_TRIPS], ids=[c[0] for c in ROUND_TRIPS]
)
def test_round_trip_through_one_region(
    client: ShmClient,
    objects: Objects,
    model: str,
    inputs: dict[str, tuple[str, np.ndarray, bool]],
    outputs: dict[str, tuple[np.ndarray, bool]],
) -> None:
    # Every tensor in one region, each at its own offset (all but the first past 0).
    handle, key = objects.create(4096)
    client.register("data", key, 4096)
    offset = 0
    sent: dict[str, tuple[str, list[int], Any]] = {}
    for name, (datatype, value, in_shm) in inputs.items():
        source: Any = value
        if in_shm:
            size = _nbytes(datatype, value)
            data = serialize_byte_tensor(value) if datatype == "BYTES" else value
            shm.set_shared_memory_region(handle, [data], offset=offset)
            source = ("data", size, offset)
            offset += 256
        sent[name] = (datatype, list(value.shape), source)
    targets: dict[str, tuple[str, int, int] | None] = {}
    places = {}
    for name, (_, in_shm) in outputs.items():
        targets[name] = ("data", 256, offset) if in_shm else None
        places[name] = offset
        offset += 256 if in_shm else 0
    result = client.infer_shm(model, sent, targets)
    for name, (expected, in_shm) in outputs.items():
        out = result.get_output(name)
        shape = [int(d) for d in (out["shape"] if client.protocol == "http" else out.shape)]
        assert shape == list(expected.shape)
        if not in_shm:
            got = result.as_numpy(name)
        else:
            if client.protocol == "http":  # no data in the response, as Triton's
                assert "data" not in out and "parameters" not in out
            else:  # an empty place keeps the other outputs' contents at their index
                response = result.get_response()
                index = [o.name for o in response.outputs].index(name)
                assert response.raw_output_contents[index] == b""
            dtype = np.object_ if expected.dtype == object else expected.dtype
            got = shm.get_contents_as_numpy(handle, dtype, shape, offset=places[name])
        if expected.dtype == object:
            assert got.tolist() == expected.tolist()
        else:
            np.testing.assert_array_equal(got, expected)


def test_a_4_mib_input_passes_a_1_mib_body_limit(client: ShmClient, objects: Objects) -> None:
    value = f32(1, 1024 * 1024)  # 4 MiB: the body could not carry it
    handle, key = objects.create(2 * value.nbytes)
    client.register("big", key, 2 * value.nbytes)
    shm.set_shared_memory_region(handle, [value])
    result = client.infer_shm(
        "fp32",
        {"INPUT0": ("FP32", [1, value.size], ("big", value.nbytes, 0))},
        {"OUTPUT0": ("big", value.nbytes, value.nbytes)},
    )
    assert result.get_response() is not None
    got = shm.get_contents_as_numpy(handle, np.float32, [1, value.size], offset=value.nbytes)
    np.testing.assert_array_equal(got, value)


def _ok_input(region: str = "r", byte_size: int = 16, offset: int = 0) -> dict[str, Any]:
    return {"INPUT0": ("FP32", [1, 4], (region, byte_size, offset))}


# (id, what the client does with region 'r' (64 bytes of a 64-byte object, filled with a
#  valid [1, 4] FP32 input), HTTP status, gRPC code, words in the message)
ERRORS: list[tuple[str, Any, str, str, list[str]]] = [
    (
        "input past the region's end",
        lambda c, key: c.infer_shm("fp32", _ok_input("r", 16, 56), {"OUTPUT0": None}),
        "400",
        "INVALID_ARGUMENT",
        ["input 'INPUT0'", "shared_memory_offset 56 + shared_memory_byte_size 16", "region 'r'"],
    ),
    (
        "output past the region's end",
        lambda c, key: c.infer_shm("fp32", _ok_input(), {"OUTPUT0": ("r", 16, 60)}),
        "400",
        "INVALID_ARGUMENT",
        ["output 'OUTPUT0'", "run past the 64 bytes", "region 'r'"],
    ),
    (
        "output region too small",
        lambda c, key: c.infer_shm("fp32", _ok_input(), {"OUTPUT0": ("r", 8, 32)}),
        "400",
        "INVALID_ARGUMENT",
        ["output 'OUTPUT0' needs 16 bytes", "region 'r' is 8"],
    ),
    (
        "input size not its shape's",
        lambda c, key: c.infer_shm("fp32", _ok_input("r", 12), {"OUTPUT0": None}),
        "400",
        "INVALID_ARGUMENT",
        ["input 'INPUT0'", "shared_memory_byte_size is 12", "needs 16 bytes"],
    ),
    (
        "unknown input region",
        lambda c, key: c.infer_shm("fp32", _ok_input("nope"), {"OUTPUT0": None}),
        "400",
        "INVALID_ARGUMENT",
        ["input 'INPUT0'", "unknown system shared memory region 'nope'"],
    ),
    (
        "unknown output region",
        lambda c, key: c.infer_shm("fp32", _ok_input(), {"OUTPUT0": ("nope", 16, 0)}),
        "400",
        "INVALID_ARGUMENT",
        ["output 'OUTPUT0'", "unknown system shared memory region 'nope'"],
    ),
    (
        "register the same name twice",
        lambda c, key: c.register("r", key, 8),
        "400",
        "ALREADY_EXISTS",
        ["region 'r' is already registered"],
    ),
    (
        "register past the object's end",
        lambda c, key: c.register("r2", key, 60, offset=8),
        "400",
        "INVALID_ARGUMENT",
        ["region 'r2'", "offset 8 + byte_size 60 run past the 64 bytes"],
    ),
    (
        "register a key nobody created",
        lambda c, key: c.register("r2", "/inferd_test_no_such_object", 8),
        "400",
        "INVALID_ARGUMENT",
        ["no shared memory object has key '/inferd_test_no_such_object'"],
    ),
    *[
        (
            f"register key {bad!r}",
            lambda c, key, bad=bad: c.register("r2", bad, 8),
            "400",
            "INVALID_ARGUMENT",
            ["is not a POSIX shared-memory name", "never file paths"],
        )
        for bad in ["/", "..", "/../etc/passwd", "/dev/shm/x", "x\0y"]
    ],
    (
        "status of an unknown region",
        lambda c, key: c.status("nope"),
        "404",
        "NOT_FOUND",
        ["unknown system shared memory region 'nope'"],
    ),
    (
        "register CUDA shared memory",
        lambda c, key: c.raw.register_cuda_shared_memory("gpu", b"", 0, 64),
        "400",
        "INVALID_ARGUMENT",
        ["CUDA shared memory is not supported on this server (no CUDA device)"],
    ),
]


@pytest.mark.parametrize(
    ("action", "http_status", "grpc_code", "words"),
    [c[1:] for c in ERRORS],
    ids=[c[0] for c in ERRORS],
)
def test_error_then_success(
    client: ShmClient,
    objects: Objects,
    action: Any,
    http_status: str,
    grpc_code: str,
    words: list[str],
) -> None:
    handle, key = objects.create(64)
    client.register("r", key, 64)
    shm.set_shared_memory_region(handle, [f32(1, 4, start=3)])
    with pytest.raises(InferenceServerException) as info:
        action(client, key)
    expected = http_status if client.protocol == "http" else f"StatusCode.{grpc_code}"
    assert info.value.status() == expected, info.value.message()
    for word in words:
        assert word in info.value.message()
    # The server still serves, and region 'r' still works.
    client.infer_shm("fp32", _ok_input(), {"OUTPUT0": ("r", 16, 32)})
    got = shm.get_contents_as_numpy(handle, np.float32, [1, 4], offset=32)
    np.testing.assert_array_equal(got, f32(1, 4, start=3))


def test_status_lists_and_unregister_removes(client: ShmClient, objects: Objects) -> None:
    _, key_a = objects.create(128)
    _, key_b = objects.create(64)
    client.register("a", key_a, 100, offset=28)
    client.register("b", key_b, 64)
    listed = sorted(client.status(), key=lambda r: r["name"])
    assert listed == [
        {"name": "a", "key": key_a, "offset": 28, "byte_size": 100},
        {"name": "b", "key": key_b, "offset": 0, "byte_size": 64},
    ]
    assert client.status("b") == [listed[1]]
    client.unregister("a")
    assert client.status() == [listed[1]]
    client.unregister("a")  # as Triton: unregistering an unknown name is no error
    client.register("a", key_a, 8)  # the name is free again
    client.unregister()  # every region
    assert client.status() == []
    if client.protocol == "http":
        assert client.raw.get_cuda_shared_memory_status() == []
    else:
        assert not client.raw.get_cuda_shared_memory_status().regions
    client.raw.unregister_cuda_shared_memory()  # nothing to unregister: no error


def test_server_metadata_names_the_extension(client: ShmClient) -> None:
    meta = client.raw.get_server_metadata()
    extensions = meta["extensions"] if client.protocol == "http" else meta.extensions
    assert "system_shared_memory" in extensions


def test_unregister_while_queued_then_the_request_completes(
    client: ShmClient, objects: Objects, server: RunningServer, gate: Path
) -> None:
    # The gated model's one instance is held by a blocker while a request whose input and
    # output are in region 'q' waits in the queue; 'q' is unregistered; then the gate opens.
    batcher = batcher_of(server, GATED)
    handle, key = objects.create(64)
    client.register("q", key, 64)
    value = f32(1, 4, start=1)  # positive: not a blocker
    shm.set_shared_memory_region(handle, [value])
    region = server.server.dataplane.shared_memory.regions["q"]

    def send(inputs: dict[str, Any], out: tuple[str, int, int] | None) -> Any:
        c = ShmClient(client.protocol, server)
        try:
            return c.infer_shm(GATED, inputs, {"OUT": out, "EXEC": None, "BATCH": None})
        finally:
            c.raw.close()

    blocker = {"IN": ("FP32", [1, 4], np.full((1, 4), -1, np.float32))}
    gate.touch()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        try:
            held = pool.submit(send, blocker, None)
            wait_for(batcher, blocker_is_executing, "the blocker to execute")
            queued = pool.submit(send, {"IN": ("FP32", [1, 4], ("q", 16, 0))}, ("q", 16, 32))
            wait_for(batcher, lambda b: b.queue_depth() == 1, "the shared-memory request queued")
            client.unregister("q")
            assert client.status() == []
            assert region.is_mapped and region.users == 1  # held by the queued request
        finally:
            gate.unlink()
        assert held.result(timeout=30).as_numpy("OUT").shape == (1, 4)
        result = queued.result(timeout=30)
    assert int(result.as_numpy("BATCH")[0, 0]) == 1
    got = shm.get_contents_as_numpy(handle, np.float32, [1, 4], offset=32)
    np.testing.assert_array_equal(got, value)
    assert not region.is_mapped and region.users == 0  # released with the last request
