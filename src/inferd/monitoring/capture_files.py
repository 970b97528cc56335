"""The capture's files: shards of sampled requests, and the index beside them (capture.md).

A shard is one `.npz` (numpy's zip of arrays, uncompressed, no pickles) holding several
captured requests. Those of one model version with the same tensors (names, datatypes,
dims past the first) form a group `g`, and each of the group's tensors is one array:
input `x` is `"{g}/in/x"`, output `y` is `"{g}/out/y"`, the requests' tensors concatenated
along their first dimension in order (rows = samples; a BF16 tensor's bits, as uint16).
The array `"meta"` holds, as UTF-8 JSON, one object per request: its group, id, time,
model, version, input fingerprint, and its tensors' names, datatypes and shapes (which say
which rows are its). A BYTES tensor, which numpy could only store pickled, is two arrays:
`"{g}/in/x.bytes"` (every element's bytes, concatenated, uint8) and `"{g}/in/x.lengths"`
(int64, shaped as the tensor).

Shards are named `capture-<UTC time>-<pid>-<seq>.npz`, so sorting names sorts them by time,
and are written under a temporary name then renamed: a reader never sees half a shard.
Each writing process appends one JSON line per request to `index-<pid>.jsonl` (the meta
object and its shard's name) once the shard is in place.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson

from inferd.datatypes import BF16
from inferd.types import Tensor

SHARD_GLOB = "capture-*.npz"
INDEX_GLOB = "index-*.jsonl"
META = "meta"


@dataclass(slots=True)
class CapturedRequest:
    """One sampled request and its answer, as the event loop hands it to the writer."""

    id: str
    time: float  # seconds since the epoch, at the request's arrival
    model: str
    version: str  # the version that served it
    protocol: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    nbytes: int  # about the bytes its tensors take (for the queue's and the disk's bounds)
    fingerprint: str = ""  # filled by the writer, off the event loop


@dataclass(slots=True)
class Captured:
    """A request loaded back: `load_capture`'s rows."""

    id: str
    time: float
    model: str
    version: str
    fingerprint: str
    protocol: str
    shard: str
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    datatypes: dict[str, str] = field(default_factory=dict)  # tensor name -> v2 datatype


def shard_arrays(requests: Iterable[CapturedRequest]) -> tuple[dict[str, np.ndarray], list[dict]]:  # type: ignore[type-arg]
    """The arrays of one shard, and the meta object of each request in it.

    Requests with the same model, version and tensors (names, datatypes, dims past the
    first) form a group `g`; each of its tensors is one array, `"{g}/in/x"`, the requests'
    tensors concatenated along the first dimension in request order: rows = samples, as a
    training set (or a drift reference) is laid out, and one `.npy` entry per tensor rather
    than per request (an entry costs far more than its bytes).
    """
    groups: dict[tuple[Any, ...], list[CapturedRequest]] = {}
    numbers: dict[tuple[Any, ...], int] = {}
    metas: list[dict[str, Any]] = []
    for req in requests:
        tensors = [("in", t) for t in req.inputs] + [("out", t) for t in req.outputs]
        same = (
            req.model,
            req.version,
            tuple((part, t.name, t.datatype, t.data.shape[1:]) for part, t in tensors),
        )
        members = groups.get(same)
        if members is None:
            members = groups[same] = []
            numbers[same] = len(numbers)
        members.append(req)
        metas.append(
            {
                "group": numbers[same],
                "id": req.id,
                "time": req.time,
                "model": req.model,
                "version": req.version,
                "fingerprint": req.fingerprint,
                "protocol": req.protocol,
                "tensors": [
                    {"part": part, "name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                    for part, t in tensors
                ],
            }
        )
    arrays: dict[str, np.ndarray] = {}
    for g, members in enumerate(groups.values()):
        first = members[0]
        for part, group_tensors in (("in", "inputs"), ("out", "outputs")):
            for n, t in enumerate(getattr(first, group_tensors)):
                key = f"{g}/{part}/{t.name}"
                parts = [_rows(getattr(r, group_tensors)[n].data) for r in members]
                data = parts[0] if len(parts) == 1 else np.concatenate(parts)
                if t.datatype == "BYTES" or data.dtype.kind in "OSU":
                    arrays[key + ".bytes"], arrays[key + ".lengths"] = _pack_bytes(data)
                elif t.datatype == "BF16":  # .npy has no bfloat16: its bits, as uint16
                    arrays[key] = np.ascontiguousarray(data).view(np.uint16)
                else:
                    arrays[key] = np.ascontiguousarray(data)
    arrays[META] = np.frombuffer(orjson.dumps(metas), np.uint8)
    return arrays, metas


def _rows(data: np.ndarray) -> np.ndarray:
    return data.reshape(1) if data.ndim == 0 else data


def npz_bytes(arrays: dict[str, np.ndarray]) -> memoryview:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getbuffer()


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> int:
    """Write the shard whole under a temporary name, then rename it; its size in bytes."""
    data = npz_bytes(arrays)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(data)


def shards(directory: Path) -> list[Path]:
    """The shards in `directory`, oldest first."""
    return sorted(directory.glob(SHARD_GLOB), key=lambda p: p.name)


def load_capture(directory: str | os.PathLike[str], model: str = "") -> list[Captured]:
    """Every captured request in `directory` (of `model`, when given), oldest first.

    `from inferd.monitoring.capture_files import load_capture; rows = load_capture("cap")`;
    `rows[0].inputs["x"]` is the array the client sent, `rows[0].outputs["y"]` the answer.
    """
    found: list[Captured] = []
    for path in shards(Path(directory)):
        try:
            found.extend(r for r in read_shard(path) if not model or r.model == model)
        except FileNotFoundError:
            continue  # dropped by the size bound while this was reading
    found.sort(key=lambda r: r.time)
    return found


def read_shard(path: Path | IO[bytes], name: str = "") -> Iterator[Captured]:
    """The captures of one shard: a file, or (from a Redis stream entry) its bytes."""
    name = name or (path.name if isinstance(path, Path) else "")
    with np.load(path, allow_pickle=False) as npz:
        metas = json.loads(npz[META].tobytes())
        columns: dict[str, np.ndarray] = {}
        offsets: dict[str, int] = {}  # array -> rows taken by earlier requests of its group
        for meta in metas:
            row = Captured(
                meta["id"],
                meta["time"],
                meta["model"],
                meta["version"],
                meta["fingerprint"],
                meta["protocol"],
                name,
            )
            for t in meta["tensors"]:
                key = f"{meta['group']}/{t['part']}/{t['name']}"
                column = columns.get(key)
                if column is None:
                    column = columns[key] = _column(npz, key, t["datatype"])
                shape = tuple(t["shape"])
                start = offsets.get(key, 0)
                rows = shape[0] if shape else 1
                offsets[key] = start + rows
                data = column[start : start + rows].reshape(shape)
                (row.inputs if t["part"] == "in" else row.outputs)[t["name"]] = data
                row.datatypes[t["name"]] = t["datatype"]
            yield row


def _column(npz: Any, key: str, datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return _unpack_bytes(npz[key + ".bytes"], npz[key + ".lengths"])
    if datatype == "BF16":
        return np.asarray(npz[key].view(BF16))
    return np.asarray(npz[key])


def read_index(directory: Path) -> list[dict[str, Any]]:
    """The index lines of every writer, as dicts (meta fields and `shard`)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(directory.glob(INDEX_GLOB)):
        with open(path, encoding="utf-8") as f:
            lines.extend(json.loads(line) for line in f if line.strip())
    return lines


def _pack_bytes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    elements = [
        bytes(e) if isinstance(e, bytes | bytearray | memoryview) else str(e).encode()
        for e in data.flat
    ]
    lengths = np.array([len(e) for e in elements], np.int64).reshape(data.shape)
    return np.frombuffer(b"".join(elements), np.uint8), lengths


def _unpack_bytes(raw: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    flat = raw.tobytes()
    ends = np.cumsum(lengths.reshape(-1))
    out = np.empty(lengths.size, object)
    start = 0
    for i, end in enumerate(ends.tolist()):
        out[i] = flat[start:end]
        start = end
    return out.reshape(lengths.shape)
