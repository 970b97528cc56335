"""Build a request's tensors from the model's metadata, and encode it once per protocol."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from inferd_tools.bench.errors import BenchError

NUMPY_TYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as the metadata gives it: -1 for variable dims


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: Any  # numpy array of `shape`


def parse_shape_option(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """--shape name:d1,d2 (repeatable) -> {name: (d1, d2)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            parsed = tuple(int(d) for d in dims.split(",") if d.strip())
            if not parsed or any(d < 0 for d in parsed):
                raise ValueError
        except ValueError:
            raise BenchError(
                f"--shape {value!r}: expected NAME:D1[,D2...] with non-negative integer dims"
            ) from None
        shapes[name] = parsed
    return shapes


def specs_from_metadata(metadata: Mapping[str, Any]) -> list[TensorSpec]:
    try:
        return [
            TensorSpec(str(i["name"]), str(i["datatype"]), tuple(int(d) for d in i["shape"]))
            for i in metadata["inputs"]
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise BenchError(f"the server's model metadata has no usable 'inputs': {e}") from None


def resolve_shapes(
    specs: Sequence[TensorSpec],
    max_batch_size: int | None,
    batch_size: int,
    shapes: Mapping[str, tuple[int, ...]],
) -> dict[str, tuple[int, ...]]:
    """The concrete shape of each input. With batching (max_batch_size > 0, or unknown and a
    leading -1), the first dim is the batch (`batch_size`) and --shape gives the rest, as
    perf_analyzer's --shape does; every other -1 needs a --shape."""
    unknown = set(shapes) - {s.name for s in specs}
    if unknown:
        raise BenchError(
            f"--shape names {', '.join(sorted(unknown))}, which the model has no input of "
            f"(inputs: {', '.join(s.name for s in specs)})"
        )
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        batched = (max_batch_size or 0) > 0 or (
            max_batch_size is None and len(spec.shape) > 0 and spec.shape[0] == -1
        )
        rest = spec.shape[1:] if batched and spec.shape else spec.shape
        if spec.name in shapes:
            given = shapes[spec.name]
            if len(given) != len(rest) or any(
                d != -1 and d != g for d, g in zip(rest, given, strict=True)
            ):
                raise BenchError(
                    f"--shape {spec.name}:{','.join(map(str, given))} does not fit the "
                    f"model's shape {list(rest)} (without the batch dim)"
                )
            rest = given
        elif any(d < 0 for d in rest):
            raise BenchError(
                f"input {spec.name!r} has variable dims {list(rest)}: give its shape with "
                f"--shape {spec.name}:{','.join('N' if d < 0 else str(d) for d in rest)}"
            )
        out[spec.name] = ((batch_size,) if batched else ()) + tuple(rest)
    return out


def load_input_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchError(f"--input-data {path}: {e}") from None
    if not isinstance(data, dict):
        raise BenchError(f'--input-data {path}: expected an object {{"input name": [values]}}')
    return data


def make_tensors(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]],
    input_data: str,
    seed: int = 0,
) -> list[Tensor]:
    """The tensors of one request: 'random', 'zero', or values from a JSON file (a flat or
    nested list per input, repeated to fill the shape if it is shorter, as for a batch)."""
    rng = np.random.default_rng(seed)
    from_file = None if input_data in ("random", "zero") else load_input_file(Path(input_data))
    tensors = []
    for spec in specs:
        if spec.datatype not in NUMPY_TYPES:
            raise BenchError(f"input {spec.name!r} has datatype {spec.datatype}, not supported")
        shape = shapes[spec.name]
        dtype = NUMPY_TYPES[spec.datatype]
        count = int(np.prod(shape, dtype=np.int64))
        if from_file is not None:
            if spec.name not in from_file:
                raise BenchError(f"--input-data {input_data} has no values for {spec.name!r}")
            flat = np.asarray(from_file[spec.name], dtype=dtype).reshape(-1)
            if flat.size == 0 or count % flat.size:
                raise BenchError(
                    f"--input-data: {flat.size} values for {spec.name!r} do not fill its "
                    f"shape {list(shape)} ({count} values)"
                )
            array = np.tile(flat, count // flat.size).reshape(shape)
        elif spec.datatype == "BYTES":
            fill = "0" if input_data == "zero" else None
            array = np.array(
                [fill or str(v) for v in rng.integers(0, 1_000_000, count)], dtype=object
            ).reshape(shape)
        elif input_data == "zero":
            array = np.zeros(shape, dtype=dtype)
        elif spec.datatype == "BOOL":
            array = rng.integers(0, 2, count).astype(np.bool_).reshape(shape)
        elif spec.datatype.startswith("FP"):
            array = rng.random(count).astype(dtype).reshape(shape)
        else:
            array = rng.integers(0, 100, count).astype(dtype).reshape(shape)
        tensors.append(Tensor(spec.name, spec.datatype, shape, array))
    return tensors


def raw_bytes(tensor: Tensor) -> bytes:
    """The binary tensor extension's (and gRPC raw_input_contents') encoding."""
    if tensor.datatype == "BYTES":
        parts = []
        for item in tensor.array.reshape(-1):
            b = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return bytes(np.ascontiguousarray(tensor.array).astype(tensor.array.dtype.newbyteorder("<")))


def json_values(tensor: Tensor) -> list[Any]:
    flat = tensor.array.reshape(-1)
    if tensor.datatype == "BYTES":
        return [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
    return list(flat.tolist())


def http_json_body(tensors: Sequence[Tensor]) -> tuple[bytes, dict[str, str]]:
    body = {
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "data": json_values(t)}
            for t in tensors
        ]
    }
    return orjson.dumps(body), {"Content-Type": "application/json"}


def http_binary_body(tensors: Sequence[Tensor]) -> tuple[bytes, dict[str, str]]:
    """Binary inputs, and binary outputs asked for (as perf_analyzer does over HTTP)."""
    raws = [raw_bytes(t) for t in tensors]
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": t.name,
                    "datatype": t.datatype,
                    "shape": list(t.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
                for t, raw in zip(tensors, raws, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + b"".join(raws), headers


def grpc_body(model: str, version: str, tensors: Sequence[Tensor]) -> bytes:
    """A serialized ModelInferRequest with raw_input_contents, built once and sent as is."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for t in tensors:
        request.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        request.raw_input_contents.append(raw_bytes(t))
    return bytes(request.SerializeToString())
