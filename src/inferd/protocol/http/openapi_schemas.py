"""The JSON Schemas of the HTTP bodies inferd reads and writes, for its OpenAPI document
(openapi_document.py): the components every route shares.

Names and shapes follow the OpenAPI document KServe publishes for the v2 protocol
(`rest_predict_v2.yaml`: `inference_request`, `request_input`, `metadata_model_response`,
...), with Triton's extensions beside them; where inferd answers otherwise than KServe's
document, the schema's description says so. A model's own request (its input names, types
and shapes) is openapi_models.py's.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

# JSON elements of each v2 datatype (Triton's JSON encoding: numbers, booleans, strings).
_INT_RANGES = {
    "INT8": (-(2**7), 2**7 - 1),
    "INT16": (-(2**15), 2**15 - 1),
    "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1),
    "UINT8": (0, 2**8 - 1),
    "UINT16": (0, 2**16 - 1),
    "UINT32": (0, 2**32 - 1),
    "UINT64": (0, 2**64 - 1),
}
DATATYPES = ("BOOL", *_INT_RANGES, "FP16", "BF16", "FP32", "FP64", "BYTES")


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def element_schema(datatype: str) -> Schema:
    """One element of a tensor of `datatype`, as JSON holds it."""
    if datatype == "BOOL":
        return {"type": "boolean"}
    if datatype == "BYTES":
        return {"type": "string"}
    if datatype in _INT_RANGES:
        low, high = _INT_RANGES[datatype]
        return {"type": "integer", "minimum": low, "maximum": high}
    return {"type": "number"}


def tensor_data_name(datatype: str) -> str:
    return f"tensor_data_{datatype}"


def _tensor_data(datatype: str) -> Schema:
    return {
        "description": f"{datatype} elements in row-major order: flat, or nested as the shape",
        "type": "array",
        "items": {"anyOf": [element_schema(datatype), ref(tensor_data_name(datatype))]},
    }


_STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
_SCALAR: Schema = {"type": ["string", "number", "boolean"]}
_COUNT_NS: Schema = {
    "type": "object",
    "required": ["count", "ns"],
    "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}},
}


def _object(required: list[str], properties: dict[str, Schema], **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema.update(extra)
    return schema


# Schemas shared by every route; a model's own are added beside them (openapi_models.py).
SCHEMAS: dict[str, Schema] = {
    "error": _object(
        ["error"],
        {"error": {"type": "string", "description": "what was wrong, naming the field"}},
        description="Every failure's body, whatever the route (KServe's *_error_response).",
    ),
    "parameters": {
        "description": "Parameters (Triton's parameters extension): a string, number or "
        "boolean each.",
        "type": "object",
        "additionalProperties": _SCALAR,
    },
    "tensor_data": {
        "description": "Elements in row-major order, flat or nested (KServe's tensor_data).",
        "type": "array",
        "items": {"anyOf": [ref("tensor_data"), {"type": ["number", "string", "boolean"]}]},
    },
    **{tensor_data_name(d): _tensor_data(d) for d in DATATYPES},
    "input_parameters": _object(
        [],
        {
            "binary_data_size": {
                "type": "integer",
                "minimum": 0,
                "description": "binary tensor extension: the input's bytes follow the JSON "
                "header (no `data` then)",
            },
            "shared_memory_region": {"type": "string"},
            "shared_memory_byte_size": {"type": "integer", "minimum": 0},
            "shared_memory_offset": {"type": "integer", "minimum": 0},
        },
        description="An input's parameters: the binary tensor and shared-memory extensions.",
    ),
    "output_parameters": _object(
        [],
        {
            "binary_data": {"type": "boolean", "description": "answer this output as binary"},
            "classification": {
                "type": "integer",
                "minimum": 1,
                "description": "classification extension: the top k classes instead",
            },
            "shared_memory_region": {"type": "string"},
            "shared_memory_byte_size": {"type": "integer", "minimum": 0},
            "shared_memory_offset": {"type": "integer", "minimum": 0},
        },
        description="A requested output's parameters.",
    ),
    "request_input": _object(
        ["name", "shape", "datatype"],
        {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"enum": list(DATATYPES)},
            "parameters": ref("input_parameters"),
            "data": ref("tensor_data"),
        },
        description="One input tensor. `data` is absent when the bytes travel as binary "
        "data or in a shared-memory region.",
    ),
    "request_output": _object(
        ["name"], {"name": {"type": "string"}, "parameters": ref("output_parameters")}
    ),
    "inference_request": _object(
        ["inputs"],
        {
            "id": {"type": "string"},
            "parameters": ref("parameters"),
            "inputs": {"type": "array", "minItems": 1, "items": ref("request_input")},
            "outputs": {"type": "array", "items": ref("request_output")},
        },
        description="Any model's request; each model's own is `infer_request_<model>`.",
    ),
    "response_output": _object(
        ["name", "shape", "datatype"],
        {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"enum": list(DATATYPES)},
            "parameters": ref("parameters"),
            "data": ref("tensor_data"),
        },
        description="One output. Unlike KServe's document, `data` is absent when the output "
        "is sent as binary data (`parameters.binary_data_size`) or written to shared memory.",
    ),
    "inference_response": _object(
        ["model_name", "outputs"],
        {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "parameters": ref("parameters"),
            "outputs": {"type": "array", "items": ref("response_output")},
        },
    ),
    "metadata_server_response": _object(
        ["name", "version", "extensions"],
        {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}},
        },
    ),
    "metadata_tensor": _object(
        ["name", "datatype", "shape"],
        {
            "name": {"type": "string"},
            "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
    ),
    "metadata_model_response": _object(
        ["name", "platform"],
        {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": ref("metadata_tensor")},
            "outputs": {"type": "array", "items": ref("metadata_tensor")},
        },
    ),
    "model_config": {
        "description": "Triton's ModelConfig message as JSON (protobuf's JSON mapping, every "
        "field written); parameter `model_checksum` holds the served files' checksum.",
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}},
    },
    "model_statistics": _object(
        ["name", "version", "inference_stats"],
        {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "last_inference": {"type": "integer"},
            "inference_count": {"type": "integer"},
            "execution_count": {"type": "integer"},
            "inference_stats": {"type": "object", "additionalProperties": ref("count_ns")},
            "response_stats": {"type": "object"},
            "batch_stats": {"type": "array", "items": {"type": "object"}},
            "memory_usage": {"type": "array", "items": {"type": "object"}},
        },
    ),
    "count_ns": _COUNT_NS,
    "statistics_response": _object(
        ["model_stats"],
        {"model_stats": {"type": "array", "items": ref("model_statistics")}},
        description="Triton's statistics extension.",
    ),
    "repository_index_request": _object(
        [],
        {"ready": {"type": "boolean", "description": "list only the ready versions"}},
        description="Triton's model repository extension.",
    ),
    "repository_index_response": {
        "type": "array",
        "items": _object(
            ["name"],
            {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "state": {"type": "string"},
                "reason": {"type": "string"},
            },
        ),
    },
    "repository_load_request": _object(
        [],
        {
            "parameters": {
                "type": "object",
                "properties": {
                    "config": {
                        "type": "string",
                        "description": "a model config as JSON, in place of config.pbtxt",
                    }
                },
                "patternProperties": {
                    "^file:": {
                        "type": "string",
                        "contentEncoding": "base64",
                        "description": "a model file's bytes (needs --allow-model-upload)",
                    }
                },
                "additionalProperties": False,
            }
        },
    ),
    "repository_unload_request": _object(
        [],
        {
            "parameters": {
                "type": "object",
                "properties": {"unload_dependents": {"const": False}},
                "additionalProperties": False,
            }
        },
        description="Triton's; `unload_dependents` may only be false: inferd does not unload "
        "the ensembles made of a model (400 otherwise).",
    ),
    "ignored_body": {
        "description": "Read and ignored (Triton's clients send an empty body).",
        "type": "object",
    },
    "routing_response": _object(
        ["model", "weights", "rollbacks", "auto_rollback"],
        {
            "model": {"type": "string"},
            "weights": {"type": "object", "additionalProperties": {"type": "integer"}},
            "stable": {"type": ["string", "null"]},
            "rollbacks": {"type": "object"},
            "auto_rollback": {"type": "boolean"},
        },
        description="inferd's traffic weights between a model's versions (docs/lifecycle.md).",
    ),
    "routing_request": _object(
        ["weights"],
        {
            "weights": {
                "type": "object",
                "description": "version -> its weight (an integer >= 0, one at least > 0); "
                "its share of the traffic is its part of their sum",
                "additionalProperties": {"type": "integer", "minimum": 0},
            }
        },
    ),
    "version_request": _object([], {"version": {"type": "string"}}),
    "shared_memory_status_response": {
        "type": "array",
        "items": _object(
            ["name"],
            {
                "name": {"type": "string"},
                "key": {"type": "string"},
                "offset": {"type": "integer"},
                "byte_size": {"type": "integer"},
            },
        ),
    },
    "system_shared_memory_register_request": _object(
        ["key", "byte_size"],
        {
            "key": {"type": "string", "description": "the POSIX shared-memory object's name"},
            "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 1},
        },
        description="Triton's system shared memory extension.",
    ),
    "cuda_shared_memory_register_request": _object(
        [],
        {
            "raw_handle": {"type": "object"},
            "device_id": {"type": "integer"},
            "byte_size": {"type": "integer"},
        },
        description="Triton's CUDA shared memory extension: inferd holds no CUDA memory, so "
        "a registration is refused (400).",
    ),
    "trace_settings": {
        "description": "Triton's trace extension: setting -> value (a string or a list of "
        "strings); a POST sets those it names (null: back to the global value).",
        "type": "object",
        "additionalProperties": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "null"},
            ]
        },
    },
    "log_settings": {
        "description": "Triton's logging extension: setting -> value.",
        "type": "object",
        "additionalProperties": {"type": ["string", "integer", "boolean"]},
    },
    "drift_response": _object(
        ["model", "version", "state"],
        {
            "model": {"type": "string"},
            "version": {"type": "string"},
            "state": {"type": "string"},
            "tensors": {"type": "array", "items": {"type": "object"}},
        },
        description="inferd's drift report (docs/monitoring.md).",
    ),
    "drift_reference_request": _object(
        ["tensors"],
        {
            "tensors": {
                "type": "object",
                "description": "tensor name -> rows (JSON arrays)",
                "additionalProperties": {"type": "array"},
            }
        },
    ),
    "feedback_request": {
        "description": "A ground-truth label for a captured request (docs/capture.md).",
        "type": "object",
    },
    "feedback_response": {"type": "object"},
    "generate_request": {
        "description": "Triton's generate extension: each key naming an input is that input "
        "(a value or a flat list); every other key is a request parameter.",
        "type": "object",
        "properties": {"parameters": ref("parameters")},
        "additionalProperties": {
            "anyOf": [_SCALAR, {"type": "array", "items": _SCALAR}, {"type": "object"}]
        },
    },
    "generate_event": _object(
        ["data"],
        {
            "event": {"type": "string"},
            "id": {"type": "string"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "description": "a generate_response, or (a failure after the first "
                "response) an error",
            },
        },
        description="One server-sent event of generate_stream.",
    ),
    "generate_response": _object(
        ["model_name"],
        {"model_name": {"type": "string"}, "model_version": {"type": "string"}},
        description="One response: each output as a key (one element: the value; more: a "
        "flat list).",
    ),
}
