"""Each loaded model's own request, for the OpenAPI document: its infer request as a JSON
Schema and an example request, both generated from its config.

The schema says what the model takes: each input's name, datatype and shape (the batch
dimension 1..max_batch_size, fixed dimensions as they are, -1 any size), which inputs may be
left out (`optional`), which outputs it can be asked for, and the request parameters it
honours (sequence parameters only for a sequence model, priorities up to its levels, a
Python model's own parameters). The example is a request the model accepts: every required
input, batch 1 and variable dimensions 1, zeros (`false`, `"text"`). A decoupled model
answers through `generate_stream` (Triton's generate extension), so its example is a
generate request instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from inferd.protocol.http.openapi_schemas import Schema, element_schema, ref, tensor_data_name
from inferd.repository.model_state import ModelVersion
from inferd.tensors.signature import TensorSpec

_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# A model whose example would hold more elements than this gets none (its schema still says
# what it takes): a megabyte of zeros makes a document nobody reads.
MAX_EXAMPLE_ELEMENTS = 1 << 16


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model's request, as the document shows it."""

    name: str  # the model's name
    key: str  # its name in component keys and operation ids: [A-Za-z0-9_-]
    decoupled: bool  # answers through generate_stream, not infer
    schema: Schema  # the request body's schema
    example: dict[str, Any] | None  # a request it accepts; None: too large to show


def component_key(name: str, taken: set[str]) -> str:
    """`name` with the characters a component key cannot hold replaced, made unique."""
    key = _NAME_CHARS.sub("_", name) or "_"
    base, n = key, 1
    while key in taken:
        n += 1
        key = f"{base}-{n}"
    taken.add(key)
    return key


def model_request(mv: ModelVersion, key: str) -> ModelRequest:
    if mv.decoupled:
        return ModelRequest(mv.name, key, True, _generate_schema(mv), _generate_example(mv))
    return ModelRequest(mv.name, key, False, _infer_schema(mv), _infer_example(mv))


# -- infer --------------------------------------------------------------------------------


def _shape_schema(spec: TensorSpec, max_batch_size: int) -> Schema:
    dims: list[Schema] = []
    if max_batch_size > 0:
        dims.append({"type": "integer", "minimum": 1, "maximum": max_batch_size})
    dims += [{"type": "integer", "minimum": 0} if d == -1 else {"const": d} for d in spec.dims]
    return {
        "type": "array",
        "prefixItems": dims,
        "items": False,
        "minItems": len(dims),
        "maxItems": len(dims),
    }


def _input_schema(spec: TensorSpec, max_batch_size: int) -> Schema:
    shape = ([-1] if max_batch_size > 0 else []) + list(spec.dims)
    return {
        "type": "object",
        "description": f"input '{spec.name}': {spec.datatype} {shape}"
        + (" (optional)" if spec.optional else ""),
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"const": spec.name},
            "datatype": {"const": spec.datatype},
            "shape": _shape_schema(spec, max_batch_size),
            "data": ref(tensor_data_name(spec.datatype)),
            "parameters": ref("input_parameters"),
        },
    }


def _output_schema(mv: ModelVersion) -> Schema:
    signature = mv.signature
    names = list(signature.outputs)
    return {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"enum": names}, "parameters": ref("output_parameters")},
    }


def _request_parameters(mv: ModelVersion) -> Schema:
    """The request parameters this model honours (Triton's reserved ones it acts on, and a
    Python model's own)."""
    levels = int(mv.config.dynamic_batching.priority_levels)
    properties: dict[str, Schema] = {
        "binary_data_output": {"type": "boolean", "description": "every output as binary"},
        "priority": {
            "type": "integer",
            "minimum": 0,
            "maximum": levels,
            "description": "its priority level (1 is the highest; 0: the model's default)",
        },
        "timeout": {
            "type": "integer",
            "minimum": 0,
            "maximum": 2**64 - 1,
            "description": "how long it may wait in the queue, in microseconds (0: no limit)",
        },
        "inferd_degrade": {
            "type": "boolean",
            "description": "false: never answered by a degradation tier",
        },
    }
    if mv.sequence is not None:
        properties |= {
            "sequence_id": {"type": ["integer", "string"], "minimum": 0, "maximum": 2**64 - 1},
            "sequence_start": {"type": "boolean"},
            "sequence_end": {"type": "boolean"},
        }
    schema: Schema = {"type": "object", "properties": properties}
    if mv.signature.model_parameters:
        schema["description"] = "the model reads every other parameter (a string, number or "
        schema["description"] += "boolean)"
        schema["additionalProperties"] = {"type": ["string", "number", "boolean"]}
    else:
        schema["additionalProperties"] = False
    return schema


def _infer_schema(mv: ModelVersion) -> Schema:
    signature = mv.signature
    specs = list(signature.inputs.values())
    required = [s for s in specs if not s.optional]
    inputs: Schema = {
        "type": "array",
        "minItems": len(required),
        "maxItems": len(specs),
        "items": {"oneOf": [_input_schema(s, signature.max_batch_size) for s in specs]},
    }
    if required:
        inputs["allOf"] = [
            {"contains": {"type": "object", "properties": {"name": {"const": s.name}}}}
            for s in required
        ]
    return {
        "type": "object",
        "description": f"An infer request of model '{mv.name}', from its config.",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": _request_parameters(mv),
            "inputs": inputs,
            "outputs": {
                "type": "array",
                "maxItems": len(signature.outputs),
                "items": _output_schema(mv),
            },
        },
    }


def _example_shape(spec: TensorSpec, batched: bool) -> list[int]:
    return ([1] if batched else []) + [1 if d == -1 else d for d in spec.dims]


def _example_value(datatype: str) -> Any:
    if datatype == "BOOL":
        return False
    if datatype == "BYTES":
        return "text"
    return 0


def _infer_example(mv: ModelVersion) -> dict[str, Any] | None:
    signature = mv.signature
    inputs = []
    elements = 0
    for spec in signature.inputs.values():
        if spec.optional:
            continue
        shape = _example_shape(spec, signature.is_batched)
        count = math.prod(shape)
        elements += count
        if elements > MAX_EXAMPLE_ELEMENTS:
            return None
        inputs.append(
            {
                "name": spec.name,
                "datatype": spec.datatype,
                "shape": shape,
                "data": [_example_value(spec.datatype)] * count,
            }
        )
    example: dict[str, Any] = {"inputs": inputs}
    if mv.sequence is not None:
        example["parameters"] = {"sequence_id": 1, "sequence_start": True, "sequence_end": True}
    return example


# -- generate (decoupled models) ----------------------------------------------------------


def _generate_schema(mv: ModelVersion) -> Schema:
    signature = mv.signature
    properties: dict[str, Schema] = {
        spec.name: {
            "anyOf": [
                element_schema(spec.datatype),
                {"type": "array", "items": element_schema(spec.datatype)},
            ],
            "description": f"input '{spec.name}' ({spec.datatype}): a value or a flat list",
        }
        for spec in signature.inputs.values()
    }
    properties["parameters"] = _request_parameters(mv)
    return {
        "type": "object",
        "description": f"A generate request of model '{mv.name}' (decoupled: its answers "
        "stream), from its config.",
        "required": [s.name for s in signature.inputs.values() if not s.optional],
        "properties": properties,
        "additionalProperties": {"type": ["string", "number", "boolean"]},
    }


def _generate_example(mv: ModelVersion) -> dict[str, Any]:
    example: dict[str, Any] = {}
    for spec in mv.signature.inputs.values():
        if not spec.optional:
            example[spec.name] = (
                "one two three" if spec.datatype == "BYTES" else _example_value(spec.datatype)
            )
    return example
