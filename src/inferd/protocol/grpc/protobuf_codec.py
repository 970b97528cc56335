"""The v2 tensor codec for gRPC: `ModelInferRequest` / `ModelInferResponse` <-> types.

Inputs come as `raw_input_contents` (decoded with `np.frombuffer`, as the HTTP binary
extension) or typed `contents`; outputs always go back as `raw_output_contents`, as Triton's
server does, which every v2 gRPC client decodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from inferd.datatypes import ITEMSIZE, V2_TO_WIRE, numpy_dtype
from inferd.errors import invalid
from inferd.limits import response_too_large
from inferd.protocol.strict_values import check_flags
from inferd.tensors.wire_format import (
    MAX_BYTES_ELEMENTS,
    NO_DATA,
    REGION,
    check_bytes_count,
    check_requested_once,
    declared_count,
    decode_bytes_elements,
    shared_memory_ref,
    to_binary,
)
from inferd.types import Array, InferRequest, InferResponse, RequestedOutput, Tensor

# Which typed `contents` field carries each datatype (Triton's mapping; FP16 travels raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters_to_dict(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which) if which else None
    return out


def set_parameter(target: Any, key: str, value: Any) -> None:
    param = target[key]
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)


def decode_infer_request(
    msg: pb.ModelInferRequest, max_bytes_elements: int = MAX_BYTES_ELEMENTS
) -> InferRequest:
    if not msg.inputs:
        raise invalid("malformed request: 'inputs' must not be empty")
    params = [parameters_to_dict(t.parameters) for t in msg.inputs]
    refs = [
        shared_memory_ref(p, f"input '{t.name}'") if p else None
        for t, p in zip(msg.inputs, params, strict=True)
    ]
    # As Triton: raw_input_contents holds the inputs that are not in shared memory, in order.
    raw = msg.raw_input_contents
    sent = len(msg.inputs) - sum(ref is not None for ref in refs)
    if raw and len(raw) != sent:
        raise invalid(
            f"raw_input_contents holds {len(raw)} buffers for {sent} inputs not in shared "
            "memory; give one per such input, in the inputs' order"
        )
    inputs = []
    next_raw = 0
    for index, t in enumerate(msg.inputs):
        where = f"input '{t.name}'"
        if not t.name:
            raise invalid(f"inputs[{index}]: 'name' must be a non-empty string")
        dtype = numpy_dtype(t.datatype, where)
        if any(d < 0 for d in t.shape):
            raise invalid(f"{where}: 'shape' must be a list of non-negative integers")
        shape = tuple(int(d) for d in t.shape)
        count = declared_count(shape, where)
        ref = refs[index]
        if ref is not None:
            if t.HasField("contents"):
                raise invalid(f"{where}: give either contents or {REGION}, not both")
            data = NO_DATA  # the core reads it from the region
        elif raw:
            if t.contents.ListFields():  # Triton refuses the mix too: which would count?
                raise invalid(
                    f"{where}: has contents while the request sends raw_input_contents; send "
                    "every input's data in raw_input_contents, or every input's in contents"
                )
            buf = raw[next_raw]
            data = _from_raw(buf, t.datatype, shape, count, where, max_bytes_elements)
            next_raw += 1
        else:
            if t.datatype == "BYTES":
                check_bytes_count(count, max_bytes_elements, where)
            data = _from_contents(t, dtype, shape, count, where)
        inputs.append(Tensor(t.name, t.datatype, shape, data, params[index], ref))
    uses_shared_memory = sent < len(msg.inputs)
    outputs = None
    if msg.outputs:
        outputs = []
        seen: set[str] = set()
        for o in msg.outputs:
            check_requested_once(o.name, seen)
            where = f"output '{o.name}'"
            out_params = parameters_to_dict(o.parameters)
            if out_params:
                check_flags(out_params, where)
            out_ref = shared_memory_ref(out_params, where) if out_params else None
            uses_shared_memory = uses_shared_memory or out_ref is not None
            outputs.append(RequestedOutput(o.name, out_params, out_ref))
    parameters = parameters_to_dict(msg.parameters)
    if parameters:
        check_flags(parameters, "request")
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        inputs=inputs,
        id=msg.id,
        outputs=outputs,
        parameters=parameters,
        uses_shared_memory=uses_shared_memory,
    )


def _from_raw(
    buf: bytes, datatype: str, shape: tuple[int, ...], count: int, where: str, max_bytes: int
) -> Array:
    if datatype == "BYTES":
        return decode_bytes_elements(buf, count, where, max_bytes).reshape(shape)
    expected = count * ITEMSIZE[datatype]
    if len(buf) != expected:
        raise invalid(
            f"{where}: raw_input_contents holds {len(buf)} bytes but shape {list(shape)} of "
            f"{datatype} needs {expected}"
        )
    return np.frombuffer(buf, dtype=V2_TO_WIRE[datatype], count=count).reshape(shape)


def _from_contents(
    t: Any, dtype: np.dtype[Any], shape: tuple[int, ...], count: int, where: str
) -> Array:
    field = CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise invalid(f"{where}: {t.datatype} data must be sent in raw_input_contents")
    for given, _ in t.contents.ListFields():  # gRPC would drop data in another field
        if given.name != field:
            raise invalid(
                f"{where}: {t.datatype} data goes in contents.{field}, not contents.{given.name}"
            )
    values = getattr(t.contents, field)
    if len(values) != count:
        raise invalid(
            f"{where}: contents.{field} holds {len(values)} elements but shape {list(shape)} "
            f"needs {count}"
        )
    if t.datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        wide = np.array(values, dtype=np.uint64 if dtype.kind == "u" else np.int64)
        if count and (wide.min() < info.min or wide.max() > info.max):
            raise invalid(f"{where}: contents.{field} values are out of {t.datatype}'s range")
        return wide.astype(dtype).reshape(shape)
    return np.array(values, dtype=dtype).reshape(shape)


def parse_infer_request(raw: bytes) -> pb.ModelInferRequest:
    """A ModelInferRequest from its wire bytes (inferd parses it, not gRPC: off the loop
    when it is large)."""
    try:
        return pb.ModelInferRequest.FromString(raw)
    except DecodeError as exc:
        raise invalid(f"malformed ModelInferRequest: {exc}") from None


def encode_infer_response(response: InferResponse, max_bytes: int = 0) -> pb.ModelInferResponse:
    """The response message; past `max_bytes` of tensor data (0: no limit) it stops with
    PAYLOAD_TOO_LARGE before adding the output that passes it."""
    msg = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for key, value in response.parameters.items():
        set_parameter(msg.parameters, key, value)
    produced = 0
    for tensor in response.outputs:
        # An output written to shared memory keeps its (empty) place, as Triton's: clients
        # find each output's contents by its index.
        raw = b"" if tensor.shared_memory is not None else to_binary(tensor)
        produced += len(raw)
        if max_bytes and produced > max_bytes:
            raise response_too_large(produced, max_bytes, at_least=True)
        msg.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        msg.raw_output_contents.append(bytes(raw))
    return msg


def serialize_infer_response(
    response: InferResponse, max_bytes: int, stream_parameters: dict[str, Any] | None = None
) -> bytes:
    """A ModelInferResponse's wire bytes; with `stream_parameters` (added to it), those of a
    ModelStreamInferResponse holding it: the same bytes behind field 2's tag and length,
    built without copying the message into another."""
    msg = encode_infer_response(response, max_bytes)
    if stream_parameters is None:
        plain: bytes = msg.SerializeToString()
        return plain
    for key, value in stream_parameters.items():
        set_parameter(msg.parameters, key, value)
    inner: bytes = msg.SerializeToString()
    return _STREAM_INFER_RESPONSE_TAG + _varint(len(inner)) + inner


# ModelStreamInferResponse.infer_response: field 2, wire type 2 (length-delimited).
_STREAM_INFER_RESPONSE_TAG = bytes([(2 << 3) | 2])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
