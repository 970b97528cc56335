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


def is_batched(spec: TensorSpec, max_batch_size: int | None) -> bool:
    """Whether the input's first dim is the batch: the model batches (max_batch_size > 0),
    or, with no config to say, its metadata leads with a -1."""
    return (max_batch_size or 0) > 0 or (
        max_batch_size is None and len(spec.shape) > 0 and spec.shape[0] == -1
    )


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
        batched = is_batched(spec, max_batch_size)
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
        raise BenchError(
            f'--input-data {path}: expected an object {{"input name": [values]}}, or '
            f'perf_analyzer\'s {{"data": [{{"input name": ...}}, ...]}}'
        )
    return data


def entries_of(data: Mapping[str, Any]) -> list[Any] | None:
    """perf_analyzer's `--input-data` document's entries (`{"data": [{...}, ...]}`, one
    request each), or None for inferd's own `{"input name": [values]}` (whose input may be
    called `data`, with values that are not objects)."""
    entries = data.get("data")
    if isinstance(entries, list) and all(isinstance(e, dict) for e in entries):
        return entries
    return None


def _flat_values(content: Any) -> list[Any]:
    """Nested lists flattened (perf_analyzer takes both); a scalar is one value."""
    if isinstance(content, list):
        return [v for item in content for v in _flat_values(item)]
    return [content]


def _kind_fits(datatype: str, value: Any) -> bool:
    if datatype == "BYTES":
        return isinstance(value, str)
    if datatype == "BOOL":
        return isinstance(value, bool)
    if datatype.startswith("FP"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)


def _entry_array(
    where: str, spec: TensorSpec, rest: tuple[int, ...], given: tuple[int, ...] | None, value: Any
) -> Any:
    """One entry's value for `spec` as an array of its row shape (no batch dim)."""
    shape: tuple[int, ...] | None = given
    content = value
    if isinstance(value, dict):
        if "b64" in value:
            raise BenchError(f"{where}: input {spec.name!r}: b64 content is not supported; "
                             "give its values as 'content'")  # fmt: skip
        unknown = set(value) - {"content", "shape"}
        if unknown or "content" not in value:
            raise BenchError(
                f'{where}: input {spec.name!r}: expected {{"content": [values], '
                f'"shape": [dims]}} or a list of values, got keys {sorted(value)}'
            )
        content = value["content"]
        if "shape" in value:
            raw = value["shape"]
            if not isinstance(raw, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
            ):
                raise BenchError(
                    f"{where}: input {spec.name!r}: 'shape' must be a list of non-negative "
                    f"integers, got {raw!r}"
                )
            shape = tuple(raw)
    if shape is None:
        if any(d < 0 for d in rest):
            raise BenchError(
                f"{where}: input {spec.name!r} has variable dims {list(rest)}: give the "
                "entry's 'shape' (or --shape)"
            )
        shape = rest
    if len(shape) != len(rest) or any(d != -1 and d != g for d, g in zip(rest, shape, strict=True)):
        raise BenchError(
            f"{where}: input {spec.name!r}: shape {list(shape)} does not fit the model's "
            f"{list(rest)} (without the batch dim)"
        )
    values = _flat_values(content)
    bad = next((v for v in values if not _kind_fits(spec.datatype, v)), None)
    if bad is not None:
        kind = {"BYTES": "strings", "BOOL": "true/false"}.get(spec.datatype, "numbers")
        if spec.datatype.startswith(("INT", "UINT")):
            kind = "integers"
        raise BenchError(
            f"{where}: input {spec.name!r} is {spec.datatype}: its values must be {kind}, "
            f"got {bad!r}"
        )
    count = int(np.prod(shape, dtype=np.int64))
    if len(values) != count:
        raise BenchError(
            f"{where}: input {spec.name!r}: {len(values)} values do not fill its shape "
            f"{list(shape)} ({count} values)"
        )
    return np.array(values, dtype=NUMPY_TYPES[spec.datatype]).reshape(shape)


def requests_from_entries(
    source: str,
    entries: Sequence[Any],
    specs: Sequence[TensorSpec],
    max_batch_size: int | None,
    batch_size: int,
    shapes: Mapping[str, tuple[int, ...]],
) -> list[list[Tensor]]:
    """One request per entry of perf_analyzer's `--input-data` document, in order: request i
    takes entries i*b .. i*b+b-1 (cycling) as its rows, b being `batch_size` for a model that
    batches (the rows of one request must then share their shapes) and 1 for one that does
    not. Each entry gives every input, as `{"content": [...], "shape": [...]}` (shape without
    the batch dim) or as a plain list of values (shaped as the model or --shape says)."""
    if not entries:
        raise BenchError(f"--input-data {source}: 'data' has no entries")
    names = [s.name for s in specs]
    for spec in specs:
        if spec.datatype not in NUMPY_TYPES:
            raise BenchError(f"input {spec.name!r} has datatype {spec.datatype}, not supported")
    rows: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        where = f"--input-data {source}: entry {i}"
        unknown = sorted(set(entry) - set(names))
        if unknown:
            raise BenchError(
                f"{where}: {', '.join(map(repr, unknown))} is not an input of the model "
                f"(inputs: {', '.join(names)})"
            )
        row: dict[str, Any] = {}
        for spec in specs:
            if spec.name not in entry:
                raise BenchError(f"{where} has no value for input {spec.name!r}")
            batched = is_batched(spec, max_batch_size)
            rest = spec.shape[1:] if batched and spec.shape else spec.shape
            row[spec.name] = _entry_array(
                where, spec, rest, shapes.get(spec.name), entry[spec.name]
            )
        rows.append(row)
    requests = []
    for r in range(len(rows)):
        tensors = []
        for spec in specs:
            if not is_batched(spec, max_batch_size):
                array = rows[r][spec.name]
            else:
                picked = [(r * batch_size + j) % len(rows) for j in range(batch_size)]
                parts = [rows[k][spec.name] for k in picked]
                if any(p.shape != parts[0].shape for p in parts):
                    raise BenchError(
                        f"--input-data {source}: entries {picked[0]}-{picked[-1]} make one "
                        f"request of {batch_size} rows (-b), but their {spec.name!r} shapes "
                        "differ; use -b 1, or entries of one shape"
                    )
                array = np.stack(parts)
            tensors.append(Tensor(spec.name, spec.datatype, tuple(array.shape), array))
        requests.append(tensors)
    return requests


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


def make_requests(
    specs: Sequence[TensorSpec],
    max_batch_size: int | None,
    batch_size: int,
    shapes: Mapping[str, tuple[int, ...]],
    input_data: str,
    seed: int = 0,
) -> list[list[Tensor]]:
    """The requests a run cycles through: one per entry of a perf_analyzer `--input-data`
    file, else the one request `make_tensors` builds."""
    if input_data not in ("random", "zero"):
        entries = entries_of(load_input_file(Path(input_data)))
        if entries is not None:
            return requests_from_entries(
                input_data, entries, specs, max_batch_size, batch_size, shapes
            )
    resolved = resolve_shapes(specs, max_batch_size, batch_size, shapes)
    return [make_tensors(specs, resolved, input_data, seed=seed)]


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
