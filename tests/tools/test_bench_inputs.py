"""inferd bench's options and request encoding."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.inputs import (
    TensorSpec,
    grpc_body,
    http_binary_body,
    http_json_body,
    make_requests,
    make_tensors,
    parse_shape_option,
    raw_bytes,
    resolve_shapes,
)
from inferd_tools.bench.load import Load, split_load
from inferd_tools.bench.runner import parse_levels


def test_levels_lists_and_ranges() -> None:
    assert parse_levels("1,8,64") == [1, 8, 64]
    assert parse_levels("1:64:x2") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_levels("1:16:4") == [1, 5, 9, 13]  # perf_analyzer's start:end:step
    assert parse_levels("2:4") == [2, 3, 4]
    assert parse_levels("10:40:x2", float) == [10, 20, 40]
    assert parse_levels("2.5,100", float) == [2.5, 100]
    for bad in ("", "0", "1:4:x1", "1:4:0", "a", "1.5", "1:2:3:4", "-1"):
        with pytest.raises(BenchError):
            parse_levels(bad)


def test_split_load_over_workers() -> None:
    parts = [split_load(Load(concurrency=10), i, 3) for i in range(3)]
    assert [p.concurrency for p in parts] == [4, 3, 3]
    rates = [split_load(Load(rate=90.0), i, 3) for i in range(3)]
    assert sum(r.rate for r in rates) == pytest.approx(90)
    # evenly spaced in sum: worker i starts i/90 s after worker 0
    assert [r.phase_s for r in rates] == pytest.approx([0, 1 / 90, 2 / 90])
    assert len({r.seed for r in rates}) == 3


def test_shapes() -> None:
    assert parse_shape_option(["IN:4", "x:2,3"]) == {"IN": (4,), "x": (2, 3)}
    for bad in ("IN", "IN:", ":4", "IN:a", "IN:-1"):
        with pytest.raises(BenchError):
            parse_shape_option([bad])
    specs = [TensorSpec("input", "FP32", (-1, 8))]
    assert resolve_shapes(specs, 8, 4, {}) == {"input": (4, 8)}
    assert resolve_shapes(specs, None, 1, {}) == {"input": (1, 8)}  # no config: leading -1
    fixed = [TensorSpec("x", "FP32", (2, 3))]
    assert resolve_shapes(fixed, 0, 1, {}) == {"x": (2, 3)}
    variable = [TensorSpec("IN", "FP32", (-1, -1))]
    with pytest.raises(BenchError, match="--shape IN:N"):
        resolve_shapes(variable, 64, 1, {})
    assert resolve_shapes(variable, 64, 2, {"IN": (5,)}) == {"IN": (2, 5)}
    with pytest.raises(BenchError, match="does not fit"):
        resolve_shapes(specs, 8, 1, {"input": (9,)})
    with pytest.raises(BenchError, match="no input"):
        resolve_shapes(specs, 8, 1, {"other": (1,)})


def test_input_data(tmp_path: Path) -> None:
    specs = [TensorSpec("a", "FP32", (-1, 4)), TensorSpec("s", "BYTES", (-1, 2))]
    shapes = {"a": (2, 4), "s": (2, 2)}
    random = make_tensors(specs, shapes, "random")
    assert random[0].array.shape == (2, 4) and random[0].array.dtype == np.float32
    assert random[1].array.shape == (2, 2)
    zero = make_tensors(specs, shapes, "zero")
    assert not zero[0].array.any()
    data = tmp_path / "in.json"
    data.write_text(json.dumps({"a": [1, 2, 3, 4], "s": ["x", "y"]}))
    from_file = make_tensors(specs, shapes, str(data))
    assert from_file[0].array.tolist() == [[1, 2, 3, 4], [1, 2, 3, 4]]  # repeated per row
    data.write_text(json.dumps({"a": [1, 2, 3]}))
    with pytest.raises(BenchError):
        make_tensors(specs, shapes, str(data))
    with pytest.raises(BenchError):
        make_tensors(specs, shapes, str(tmp_path / "missing.json"))


def test_encodings_carry_the_same_tensors() -> None:
    specs = [TensorSpec("a", "FP32", (-1, 3)), TensorSpec("s", "BYTES", (-1, 1))]
    tensors = make_tensors(specs, {"a": (1, 3), "s": (1, 1)}, "random", seed=3)
    body, headers = http_json_body(tensors)
    doc = json.loads(body)
    assert headers["Content-Type"] == "application/json"
    assert doc["inputs"][0]["shape"] == [1, 3]
    assert doc["inputs"][0]["data"] == pytest.approx(tensors[0].array.reshape(-1).tolist())

    body, headers = http_binary_body(tensors)
    n = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:n])
    assert header["parameters"] == {"binary_data_output": True}
    a_size = header["inputs"][0]["parameters"]["binary_data_size"]
    assert a_size == 12
    assert np.frombuffer(body[n : n + a_size], np.float32).tolist() == pytest.approx(
        tensors[0].array.reshape(-1).tolist()
    )
    s_raw = body[n + a_size :]
    (length,) = struct.unpack("<I", s_raw[:4])
    assert s_raw[4:].decode() == str(tensors[1].array.reshape(-1)[0]) and length == len(s_raw) - 4

    request = pb.ModelInferRequest.FromString(grpc_body("m", "2", tensors))
    assert request.model_name == "m" and request.model_version == "2"
    assert [i.name for i in request.inputs] == ["a", "s"]
    assert list(request.inputs[0].shape) == [1, 3]
    assert request.raw_input_contents[0] == raw_bytes(tensors[0])


def test_input_data_entries_make_one_request_each(tmp_path: Path) -> None:
    """perf_analyzer's format: request i takes entries i*b .. i*b+b-1 (cycling) as its rows."""
    specs = [TensorSpec("ids", "INT64", (-1, -1))]
    entries = [{"ids": {"content": [1, 2], "shape": [2]}}, {"ids": [3, 4]}, {"ids": [5, 6]}]
    data = tmp_path / "in.json"
    data.write_text(json.dumps({"data": entries}))
    one = make_requests(specs, 8, 1, {"ids": (2,)}, str(data))
    assert [r[0].array.tolist() for r in one] == [[[1, 2]], [[3, 4]], [[5, 6]]]
    two = make_requests(specs, 8, 2, {"ids": (2,)}, str(data))
    assert [r[0].array.tolist() for r in two] == [
        [[1, 2], [3, 4]], [[5, 6], [1, 2]], [[3, 4], [5, 6]],
    ]  # fmt: skip
    # A plain list of values needs the shape of a variable dim from somewhere.
    with pytest.raises(BenchError, match="entry 1: input 'ids' has variable dims"):
        make_requests(specs, 8, 1, {}, str(data))
    entries[1] = {"ids": {"content": [3, 4, 7], "shape": [3]}}
    entries[2] = {"ids": {"content": [5, 6], "shape": [2]}}
    data.write_text(json.dumps({"data": entries}))
    assert make_requests(specs, 8, 1, {}, str(data))[1][0].shape == (1, 3)
    with pytest.raises(BenchError, match=r"entries 0-1 make one request of 2 rows \(-b\)"):
        make_requests(specs, 8, 2, {}, str(data))
    # inferd's own format, with an input that happens to be called `data`, is one request.
    data.write_text(json.dumps({"data": [1, 2]}))
    [request] = make_requests([TensorSpec("data", "INT64", (-1, 2))], 8, 1, {}, str(data))
    assert request[0].array.tolist() == [[1, 2]]
