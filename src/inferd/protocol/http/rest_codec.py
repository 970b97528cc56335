"""The v2 tensor codec: JSON tensors and Triton's binary tensor extension <-> numpy.

Decoding is vectorised: binary tensors are `np.frombuffer` views of the request body, JSON
tensors one `np.asarray` call; only BYTES elements (variable length) are walked one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from inferd.datatypes import ITEMSIZE, V2_TO_WIRE, numpy_dtype
from inferd.errors import invalid
from inferd.limits import response_too_large
from inferd.protocol.http.json_values import from_json
from inferd.protocol.strict_values import check_flags
from inferd.tensors.wire_format import (
    MAX_BYTES_ELEMENTS,
    NO_DATA,
    REGION,
    as_bytes,
    check_bytes_count,
    check_requested_once,
    declared_count,
    decode_bytes_elements,
    shared_memory_ref,
    to_binary,
)
from inferd.types import (
    Array,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)

# -- request ----------------------------------------------------------------------------------


def decode_request(
    body: bytes,
    header_length: int | None,
    model_name: str,
    model_version: str,
    max_bytes_elements: int = MAX_BYTES_ELEMENTS,
) -> InferRequest:
    """Decode an HTTP infer body: JSON, optionally followed by binary tensor data."""
    header: bytes | memoryview
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        if header_length < 0 or header_length > len(body):
            raise invalid(
                f"Inference-Header-Content-Length {header_length} is outside the body's "
                f"{len(body)} bytes"
            )
        view = memoryview(body)
        header, binary = view[:header_length], view[header_length:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"malformed JSON request: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid("malformed request: the JSON body must be an object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise invalid("malformed request: 'inputs' must be a non-empty list")
    # JSON booleans are the literals true and false: a document without either text holds
    # none, and its numbers need no search for booleans among them (json_values.py).
    end = len(body) if header_length is None else header_length
    booleans = body.find(b"true", 0, end) >= 0 or body.find(b"false", 0, end) >= 0
    offset = 0
    inputs: list[Tensor] = []
    uses_shared_memory = False
    for i, raw in enumerate(raw_inputs):
        tensor, offset = _decode_input(raw, i, binary, offset, max_bytes_elements, booleans)
        inputs.append(tensor)
        uses_shared_memory = uses_shared_memory or tensor.shared_memory is not None
    if offset != len(binary):
        raise invalid(
            f"binary data holds {len(binary) - offset} bytes more than the inputs' "
            "binary_data_size values account for"
        )
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    parameters = doc.get("parameters")
    parameters = {} if parameters is None else _parameters(parameters, "request")
    if parameters:
        check_flags(parameters, "request")
    outputs = None
    if "outputs" in doc:
        raw_outputs = doc["outputs"]
        if not isinstance(raw_outputs, list):
            raise invalid("'outputs' must be a list")
        outputs = []
        seen: set[str] = set()
        for j, raw in enumerate(raw_outputs):
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise invalid(f"outputs[{j}] must be an object with a string 'name'")
            check_requested_once(raw["name"], seen)
            where = f"output '{raw['name']}'"
            params = _parameters(raw.get("parameters"), where)
            if params:
                check_flags(params, where)
            ref = shared_memory_ref(params, where) if params else None
            uses_shared_memory = uses_shared_memory or ref is not None
            outputs.append(RequestedOutput(raw["name"], params, ref))
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        id=request_id,
        outputs=outputs,
        parameters=parameters,
        uses_shared_memory=uses_shared_memory,
    )


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}  # (the hot callers check for None themselves)
    if not isinstance(raw, dict):
        raise invalid(f"{where}: 'parameters' must be an object")
    return raw


def decode_json_input(raw: Any, index: int, max_bytes_elements: int = MAX_BYTES_ELEMENTS) -> Tensor:
    """One input object of a JSON request (`name`, `datatype`, `shape`, `data`)."""
    return _decode_input(raw, index, memoryview(b""), 0, max_bytes_elements)[0]


def _decode_input(
    raw: Any,
    index: int,
    binary: memoryview,
    offset: int,
    max_bytes_elements: int,
    booleans: bool = True,
) -> tuple[Tensor, int]:
    if not isinstance(raw, dict):
        raise invalid(f"inputs[{index}] must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"inputs[{index}]: 'name' must be a non-empty string")
    where = f"input '{name}'"
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise invalid(f"{where}: 'datatype' must be a string")
    dtype = numpy_dtype(datatype, where)
    shape_raw = raw.get("shape")
    if not isinstance(shape_raw, list):
        raise invalid(f"{where}: 'shape' must be a list of non-negative integers")
    for d in shape_raw:  # type() is not bool's int: true/false are not dimensions
        if type(d) is not int or d < 0:
            raise invalid(f"{where}: 'shape' must be a list of non-negative integers")
    shape = tuple(shape_raw)
    count = declared_count(shape, where)
    params = raw.get("parameters")  # (None, the common case, checked inline)
    params = {} if params is None else _parameters(params, where)
    size = params.get("binary_data_size")
    ref = shared_memory_ref(params, where) if params else None
    if ref is not None:  # the core reads the data from the region
        if size is not None or "data" in raw:
            raise invalid(f"{where}: give one of 'data', binary_data_size or {REGION}")
        return Tensor(name, datatype, shape, NO_DATA, params, ref), offset
    if size is not None:
        if "data" in raw:
            raise invalid(f"{where}: give either 'data' or binary_data_size, not both")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise invalid(f"{where}: binary_data_size must be a non-negative integer")
        if offset + size > len(binary):
            raise invalid(
                f"{where}: binary_data_size {size} exceeds the {len(binary) - offset} bytes "
                "of binary data left in the body"
            )
        chunk = binary[offset : offset + size]
        data = _from_binary(chunk, datatype, shape, count, where, max_bytes_elements)
        return Tensor(name, datatype, shape, data, params), offset + size
    if "data" not in raw:
        raise invalid(f"{where}: no 'data' and no binary_data_size")
    if datatype == "BYTES":
        check_bytes_count(count, max_bytes_elements, where)
    data = from_json(raw["data"], datatype, dtype, shape, count, where, booleans)
    return Tensor(name, datatype, shape, data, params), offset


def _from_binary(
    chunk: memoryview,
    datatype: str,
    shape: tuple[int, ...],
    count: int,
    where: str,
    max_bytes_elements: int,
) -> Array:
    if datatype == "BYTES":
        return decode_bytes_elements(chunk, count, where, max_bytes_elements).reshape(shape)
    expected = count * ITEMSIZE[datatype]
    if len(chunk) != expected:
        raise invalid(
            f"{where}: binary data holds {len(chunk)} bytes but shape {list(shape)} of "
            f"{datatype} needs {expected}"
        )
    array = np.frombuffer(chunk, dtype=V2_TO_WIRE[datatype], count=count)
    if not array.flags.aligned:
        array = array.copy()  # ONNX Runtime and numpy kernels want aligned buffers
    return array.reshape(shape)


# -- response ---------------------------------------------------------------------------------


def encode_response(
    response: InferResponse,
    requested: list[RequestedOutput] | None,
    binary_default: bool,
    max_bytes: int = 0,
) -> tuple[bytes, int | None]:
    """Encode an infer response; returns (body, JSON header length if binary data follows).

    Past `max_bytes` (0: no limit) it stops with PAYLOAD_TOO_LARGE, before joining the body.
    """
    wants_binary = {o.name: o.parameters.get("binary_data") for o in requested or ()}
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    produced = 0  # bytes of tensor data encoded so far
    for tensor in response.outputs:
        binary = wants_binary.get(tensor.name)
        if binary is None:
            binary = binary_default
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if tensor.shared_memory is not None:
            outputs.append(entry)  # written into the client's region: no data, as Triton
            continue
        json_data = None if binary else _to_json(tensor)
        if json_data is None:
            raw = to_binary(tensor)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
            produced += len(raw)
        elif isinstance(json_data, bytes):  # a large tensor's JSON text, made in chunks
            entry["data"] = orjson.Fragment(json_data)
            produced += len(json_data)
        else:
            entry["data"] = json_data
        if max_bytes and produced > max_bytes:
            raise response_too_large(produced, max_bytes, at_least=True)
        outputs.append(entry)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if max_bytes:
        size = len(header) + sum(map(len, chunks))
        if size > max_bytes:
            raise response_too_large(size, max_bytes)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def tensor_json(tensor: Tensor) -> Any:
    """A tensor's elements as JSON data (flat), or None when it can only travel as binary
    (BYTES that are not UTF-8 text)."""
    data = _to_json(tensor)
    return orjson.Fragment(data) if isinstance(data, bytes) else data


# Elements per orjson call for a large tensor's JSON data: each call holds the interpreter
# lock for about a millisecond, so a codec thread encoding a large response lets the event
# loop in between (one call for the whole tensor held it for 0.4 s per 16 M floats).
JSON_CHUNK = 1 << 16


def _to_json(tensor: Tensor) -> Any:
    """JSON data for a tensor (a large one's as JSON text), or None when it can only travel
    as binary."""
    if tensor.datatype == "BYTES":
        try:
            return [as_bytes(v).decode("utf-8") for v in tensor.data.reshape(-1)]
        except UnicodeDecodeError:
            return None  # not text: sent as binary, which every v2 client decodes
    # A flat, contiguous numpy array: orjson serialises it natively without a Python list.
    flat = np.ascontiguousarray(tensor.data).reshape(-1)
    if tensor.datatype in ("FP16", "BF16"):  # JSON numbers; orjson knows neither type
        flat = flat.astype(np.float32)
    if flat.size <= JSON_CHUNK:
        return flat
    parts = [
        orjson.dumps(flat[i : i + JSON_CHUNK], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        for i in range(0, flat.size, JSON_CHUNK)
    ]
    return b"[" + b",".join(parts) + b"]"
