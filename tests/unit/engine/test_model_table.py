"""The model table of `--engine` (engine/model_table.py): a signature rebuilt from its plain
description refuses what the original refuses, word for word, and binds what it binds;
`bind(checked=True)` binds as `bind`; through a real engine link, the front end refuses a bad
request before the hop, and the engine trusts a check only against the current signature."""

from __future__ import annotations

import asyncio
import marshal
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.input_limits import InputLimits
from inferd.dataplane.access import AccessPolicy
from inferd.dataplane.plane import DataPlane
from inferd.engine.engine_client import EngineClient
from inferd.engine.engine_hop import EngineHop
from inferd.engine.model_table import ModelTable, describe, rebuild
from inferd.errors import InferdError
from inferd.events import CallContext, Telemetry
from inferd.repository.registry import ModelRegistry
from inferd.tensors.signature import ModelSignature
from inferd.types import InferRequest, RequestedOutput, Tensor
from tests.support.models import builders

CONFIG = """
    name: "m"
    max_batch_size: 4
    input [
      { name: "A", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 2, 2 ] } },
      { name: "T", data_type: TYPE_STRING, dims: [ 1 ], optional: true }
    ]
    output [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


def _original() -> tuple[ModelSignature, mc.ModelConfig]:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(CONFIG), config)
    signature = ModelSignature(config, InputLimits({"A": (4,)}, 12, 3))
    signature.server_inputs["START"] = "a sequence control input"
    signature.text_inputs = frozenset({"T"})
    return signature, config


def _a(rows: int, width: int = 4, datatype: str = "FP32") -> Tensor:
    data = np.zeros((rows, width), np.float32 if datatype == "FP32" else np.int32)
    return Tensor("A", datatype, (rows, width), data)


def _t(*values: bytes) -> Tensor:
    return Tensor("T", "BYTES", (len(values), 1), np.array(values, dtype=object).reshape(-1, 1))


BAD = {
    "datatype": [_a(1, datatype="INT32")],
    "shape": [_a(1, 3)],
    "batch": [_a(5)],
    "elements": [_a(4)],  # 16 > max_input_elements 12
    "unknown": [_a(1), Tensor("Z", "FP32", (1,), np.zeros(1, np.float32))],
    "server input": [_a(1), Tensor("START", "FP32", (1, 1), np.zeros((1, 1), np.float32))],
    "missing": [_t(b"ok")],
    "bytes too long": [_a(1), _t(b"long")],
    "not utf-8": [_a(1), _t(b"\xff")],
    "twice": [_a(1), _a(1)],
}


def _message(signature: ModelSignature, request: InferRequest, front: bool = False) -> str:
    with pytest.raises(InferdError) as info:
        if front:
            signature.check(request)  # what a front end runs
        else:
            signature.bind(request)  # what one process runs
    return f"{info.value.kind.name}: {info.value.message}"


@pytest.mark.parametrize("case", list(BAD))
def test_a_rebuilt_signature_refuses_as_the_original(case: str) -> None:
    original, config = _original()
    copy = rebuild(marshal.loads(marshal.dumps(describe(original, config))))
    request = InferRequest("m", "", BAD[case])
    assert _message(copy, request, front=True) == _message(original, request)


def test_check_refuses_a_bad_requested_output_as_bind() -> None:
    original, _ = _original()
    for outputs in ([RequestedOutput("Q")], [RequestedOutput("X"), RequestedOutput("X")]):
        request = InferRequest("m", "", [_a(1)], outputs=outputs)
        assert _message(original, request, front=True) == _message(original, request)
    original.check(InferRequest("m", "", [_a(1)], outputs=[RequestedOutput("X")]))


def test_a_rebuilt_signature_and_a_checked_bind_bind_as_the_original() -> None:
    original, config = _original()
    copy = rebuild(marshal.loads(marshal.dumps(describe(original, config))))
    request = InferRequest("m", "", [_a(2), _t(b"a", b"b")], outputs=[RequestedOutput("X")])
    expected = original.bind(request)
    for bound in (copy.bind(request), original.bind(request, checked=True)):
        assert (bound.rows, bound.shape_key, bound.output_names) == (
            expected.rows,
            expected.shape_key,
            expected.output_names,
        )
        assert {n: a.shape for n, a in bound.inputs.items()} == {"A": (2, 2, 2), "T": (2, 1)}


GUARDED = """
name: "guarded"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
parameters { key: "circuit_breaker_failures" value: { string_value: "3" } }
"""


def test_the_front_end_refuses_before_the_hop_and_the_engine_trusts_only_current_checks(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    for name in ("identity", "guarded"):
        model = builders.identity(TensorProto.FLOAT, ["batch", "n"])
        builders._save(model, repo / name / "1" / "model.onnx")
    (repo / "guarded" / "config.pbtxt").write_text(GUARDED)

    async def scenario() -> None:
        registry = ModelRegistry(repo, Telemetry())
        table = ModelTable(registry.models)
        dataplane = DataPlane(registry, registry.telemetry, checked_signatures=table)
        await registry.load_all()
        engine = EngineHop(dataplane, table, tmp_path / "engine.sock")
        await engine.start()
        client = EngineClient(AccessPolicy(), tmp_path / "engine.sock", tmp_path, 1 << 20)
        await client.connect()
        ctx = CallContext("http")
        x = np.ones((1, 3), np.float32)
        good = InferRequest("identity", "", [Tensor("INPUT0", "FP32", (1, 3), x)])
        bad = InferRequest("identity", "1", [Tensor("INPUT0", "INT32", (1, 3), x.astype(int))])
        # The table arrives after the hello: the first request may already find it.
        await asyncio.wait_for(_until(lambda: client.table.check(good) != 0), 5)
        with client.start("identity", "1", ctx) as call, pytest.raises(InferdError) as refused:
            await client.infer(call, bad)
        expected = registry.get("identity").signature
        assert f"{refused.value.kind.name}: {refused.value.message}" == _message(expected, bad)
        assert engine.requests == {}  # never crossed the hop
        with client.start("identity", "", ctx) as call:
            response = await client.infer(call, good)
            np.testing.assert_array_equal(response.outputs[0].data, x)
        assert engine.requests == {0: 1}
        # A model with a circuit breaker: an open circuit answers before the signature, so
        # its requests are the engine's to check, and its answer is one process's.
        guarded = InferRequest("guarded", "1", bad.inputs)
        with client.start("guarded", "1", ctx) as call, pytest.raises(InferdError) as refused:
            await client.infer(call, guarded)
        expected = registry.get("guarded").signature
        assert f"{refused.value.kind.name}: {refused.value.message}" == _message(expected, guarded)
        assert engine.requests == {0: 2}
        generation = good.signature_generation
        mv = registry.get("identity")
        assert engine.table.is_current(mv, generation)
        # A reload with another config: a new version object, a new signature, a new
        # generation; the old one no longer vouches for anything.
        config = mc.ModelConfig()
        config.CopyFrom(mv.config)
        config.max_batch_size = 2
        await registry.load_model("identity", override=config)
        reloaded = registry.get("identity")
        assert reloaded is not mv
        assert not engine.table.is_current(reloaded, generation)
        await asyncio.wait_for(_until(lambda: client.table.check(good) not in (0, generation)), 5)
        assert engine.table.is_current(reloaded, client.table.check(good))
        client.close()
        await engine.close()
        await registry.unload_all()

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


M_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
"""


def test_a_restarted_engine_s_generations_never_vouch_for_the_old_engine_s_signatures(
    tmp_path: Path,
) -> None:
    """Each engine numbers its signatures from 1: a front end reconnecting to a new engine
    (a crash, a restart) drops the old table, or the old signature of generation 1 would be
    checked and the new engine would trust it for its own generation 1."""
    repos = {}
    for name, max_batch in (("old", 8), ("new", 2)):
        repo = repos[name] = tmp_path / name
        builders._save(
            builders.identity(TensorProto.FLOAT, ["batch", "n"]), repo / "m" / "1" / "model.onnx"
        )
        (repo / "m" / "config.pbtxt").write_text(M_CONFIG.format(max_batch=max_batch))
    socket = tmp_path / "engine.sock"

    async def engine(repo: Path) -> tuple[ModelRegistry, EngineHop]:
        registry = ModelRegistry(repo, Telemetry())
        await registry.load_all()
        table = ModelTable(registry.models)
        dataplane = DataPlane(registry, registry.telemetry, checked_signatures=table)
        hop = EngineHop(dataplane, table, socket)
        await hop.start()
        return registry, hop

    def rows(n: int) -> InferRequest:
        return InferRequest(
            "m", "", [Tensor("INPUT0", "FP32", (n, 1), np.ones((n, 1), np.float32))]
        )

    async def scenario() -> None:
        registry, old = await engine(repos["old"])
        client = EngineClient(AccessPolicy(), socket, tmp_path, 1 << 20)
        await client.connect()
        await asyncio.wait_for(_until(lambda: client.table.check(rows(4)) != 0), 5)
        await old.close()
        await registry.unload_all()
        registry, new = await engine(repos["new"])
        await asyncio.wait_for(_until(lambda: bool(new.links)), 5)
        await asyncio.wait_for(_until(lambda: client.table.check(rows(1)) != 0), 5)
        ctx = CallContext("http")
        with client.start("m", "", ctx) as call, pytest.raises(InferdError) as refused:
            await client.infer(call, rows(4))
        assert refused.value.message == (
            "input 'INPUT0': batch size 4 is outside 1..2 (max_batch_size of model 'm')"
        )
        assert new.requests == {}  # refused by the front end, on the new engine's table
        client.close()
        await new.close()
        await registry.unload_all()

    asyncio.run(scenario())
