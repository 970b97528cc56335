"""Read `config.pbtxt` into Triton's `ModelConfig` message and check it field by field.

Errors name the file and the field, so an operator can fix a model without reading our code.
Backend-specific completion (e.g. ONNX inputs from the model file) happens in the backend;
`validate` runs after it, on the completed config.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.config_fields import refused_fields
from inferd.config.config_parameters import refused_parameters
from inferd.datatypes import CONFIG_TO_V2

CONFIG_FILE = "config.pbtxt"

PLATFORM_TO_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "ensemble": "ensemble",  # pipelines/: a graph of other models, no backend of its own
}


class ConfigError(Exception):
    """A model's configuration is malformed or inconsistent; the message names file and field."""


def read_config(model_dir: Path) -> tuple[mc.ModelConfig, bool]:
    """Parse `<model_dir>/config.pbtxt`; returns (config, whether the file existed)."""
    path = model_dir / CONFIG_FILE
    config = mc.ModelConfig()
    if not path.exists():
        config.name = model_dir.name
        return config, False
    try:
        text = path.read_text(encoding="utf-8")
        text_format.Parse(text, config)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{model_dir.name}/{CONFIG_FILE}: {exc}") from None
    if not config.name:
        config.name = model_dir.name
    return config, True


def config_needed(model: str, backend_line: str, file: str, also: str = "") -> str:
    """What to add when a model without config.pbtxt does not say which tensors it has."""
    return (
        f"{model}: no config.pbtxt, and {model}/{file} does not say which tensors "
        f"it takes and returns; add {model}/config.pbtxt declaring them, e.g. {backend_line} "
        'max_batch_size: 8 input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ] '
        f'output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]{also}'
    )


def backend_name(config: mc.ModelConfig) -> str:
    """Triton's rule: `backend` wins; otherwise it follows from `platform`."""
    if config.backend:
        return str(config.backend)
    return PLATFORM_TO_BACKEND.get(config.platform, "")


def validate(config: mc.ModelConfig, model_dir: Path) -> None:
    where = f"{model_dir.name}/{CONFIG_FILE}"
    if config.name != model_dir.name:
        raise ConfigError(
            f"{where}: name '{config.name}' must match the model directory '{model_dir.name}'"
        )
    check_honoured(config, where)
    if config.max_batch_size < 0:
        raise ConfigError(f"{where}: max_batch_size must be >= 0, got {config.max_batch_size}")
    if not config.input:
        raise ConfigError(f"{where}: input: the model declares no inputs")
    if not config.output:
        raise ConfigError(f"{where}: output: the model declares no outputs")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for t in tensors:
            field = f"{where}: {kind} '{t.name}'"
            if not t.name:
                raise ConfigError(f"{where}: {kind}: every {kind} needs a name")
            if t.name in seen:
                raise ConfigError(f"{field}: declared twice")
            seen.add(t.name)
            if t.data_type not in CONFIG_TO_V2:
                raise ConfigError(
                    f"{field}: data_type {mc.DataType.Name(t.data_type)} is not supported"
                )
            if not t.dims and not (t.HasField("reshape") and config.max_batch_size > 0):
                raise ConfigError(f"{field}: dims must list at least one dimension")
            if any(d < -1 or d == 0 for d in t.dims):
                raise ConfigError(f"{field}: dims {list(t.dims)} must be positive or -1")
            if t.HasField("reshape"):
                _check_reshape(field, list(t.dims), list(t.reshape.shape))
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        if config.max_batch_size == 0:
            raise ConfigError(
                f"{where}: dynamic_batching needs max_batch_size > 0 (the model does not batch)"
            )
        levels = db.priority_levels
        if levels and not 1 <= db.default_priority_level <= levels:
            raise ConfigError(
                f"{where}: dynamic_batching.default_priority_level must be within 1.."
                f"{levels} (priority_levels)"
            )
        for level in db.priority_queue_policy:
            if not 1 <= level <= max(levels, 0):
                raise ConfigError(
                    f"{where}: dynamic_batching.priority_queue_policy level {level} is outside "
                    f"1..{levels} (priority_levels)"
                )
        for size in db.preferred_batch_size:
            if size < 1 or size > config.max_batch_size:
                raise ConfigError(
                    f"{where}: dynamic_batching.preferred_batch_size {size} must be within "
                    f"1..max_batch_size ({config.max_batch_size})"
                )
    for group in config.instance_group:
        if group.count < 0:
            raise ConfigError(f"{where}: instance_group.count must be >= 0, got {group.count}")
    policy = config.version_policy
    if policy.HasField("latest") and policy.latest.num_versions < 1:
        raise ConfigError(f"{where}: version_policy.latest.num_versions must be >= 1")
    if policy.HasField("specific") and not policy.specific.versions:
        raise ConfigError(f"{where}: version_policy.specific.versions must not be empty")
    # The values of `parameters` are checked where they are parsed: spec.parse_spec.


def check_honoured(config: mc.ModelConfig, where: str) -> None:
    """Nothing set in the config may be silently ignored (config_fields.py, config_parameters.py):
    raises `ConfigError("<where>: <field path>: <why>")` for the first refused field."""
    backend = backend_name(config)
    problems = refused_fields(config, backend)
    problems += [(f"parameters.{key}", why) for key, why in refused_parameters(config, backend)]
    if problems:
        path, why = problems[0]
        others = [p for p, _ in problems[1:]]
        also = f" (also refused: {', '.join(others)})" if others else ""
        raise ConfigError(f"{where}: {path}: {why}{also}")


def _check_reshape(field: str, dims: list[int], shape: list[int]) -> None:
    if any(d < -1 or d == 0 for d in shape):
        raise ConfigError(f"{field}: reshape.shape {shape} must be positive or -1")
    if -1 in dims or -1 in shape:
        return  # variable sizes are checked per request, when the tensor is reshaped
    size_dims = 1
    for d in dims:
        size_dims *= d
    size_shape = 1
    for d in shape:
        size_shape *= d
    if size_dims != size_shape:
        raise ConfigError(
            f"{field}: reshape.shape {shape} holds {size_shape} elements but dims {dims} "
            f"hold {size_dims}"
        )


def parameter(config: mc.ModelConfig, key: str, default: str = "") -> str:
    """A raw `parameters` value. In the server only the spec parser (spec*.py) reads them;
    everything else reads the parsed `ModelSpec`."""
    if key in config.parameters:
        return str(config.parameters[key].string_value)
    return default


def int_parameter(config: mc.ModelConfig, keys: str | tuple[str, ...], default: int) -> int:
    """An integer from `parameters` (the first of `keys` that is set), else `default`."""
    for key in (keys,) if isinstance(keys, str) else keys:
        raw = parameter(config, key, "")
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(
                    f"{config.name}/config.pbtxt: parameters.{key} must be an integer, got '{raw}'"
                ) from None
    return default


def group_waste(raw: str) -> float | None:
    """A `pad_grouping_waste` value (scheduling/length_groups.py): the padding a batch may
    carry, as a share of its real elements (>= 0); -1.0 for `off`; None when it is neither."""
    if raw.lower() == "off":
        return -1.0
    try:
        waste = float(raw)
    except ValueError:
        return None
    return waste if 0 <= waste < math.inf else None


def instance_count(config: mc.ModelConfig) -> int:
    """Total instances across groups; Triton's default is one instance."""
    return sum(group_sizes(config)) or 1


def group_sizes(config: mc.ModelConfig) -> list[int]:
    """Instances per group, in order; instance indexes run through the groups in turn."""
    return [g.count if g.count > 0 else 1 for g in config.instance_group]


def instance_group_of(config: mc.ModelConfig, index: int) -> InstancePlace:
    """Where instance `index` (0-based, across groups) belongs.

    A config without groups gets Triton's default: one KIND_AUTO instance.
    """
    for position, (group, size) in enumerate(
        zip(config.instance_group, group_sizes(config), strict=True)
    ):
        if index < size:
            return InstancePlace(group, position, index)
        index -= size
    return InstancePlace(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_AUTO), 0, 0)


class InstancePlace(NamedTuple):
    group: mc.ModelInstanceGroup
    group_index: int  # the group's position in instance_group
    index_in_group: int

    def instance_name(self, model_name: str) -> str:
        """Triton's name for the instance: `<group name>_<index in group>`, a group without a
        name being `<model>_<group index>`."""
        group = self.group.name or f"{model_name}_{self.group_index}"
        return f"{group}_{self.index_in_group}"


def with_kinds_used(config: mc.ModelConfig, devices: list[str]) -> None:
    """Rewrite each group's kind to the one its instances actually run as (Triton reports
    the kind in use): KIND_GPU or KIND_AUTO on a CPU becomes KIND_CPU, KIND_AUTO on CUDA
    devices KIND_GPU. `devices` are the instances' devices, in instance order."""
    start = 0
    for group, size in zip(config.instance_group, group_sizes(config), strict=True):
        used = devices[start : start + size]
        start += size
        if not used or group.kind == mc.ModelInstanceGroup.KIND_CPU:
            continue
        if all(d == "cpu" for d in used):
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            del group.gpus[:]  # no GPU was used (and KIND_CPU with gpus is refused)
        elif all(d.startswith("cuda") for d in used):
            group.kind = mc.ModelInstanceGroup.KIND_GPU


def to_json(config: mc.ModelConfig) -> dict[str, Any]:
    """Triton's JSON rendering: proto field names, defaults included, integers as numbers.

    protobuf's JSON mapping writes 64-bit integers as strings; Triton writes numbers, and
    clients such as perf_analyzer read `dims` and `max_batch_size` as numbers.
    """
    doc: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _int64_to_numbers(config.DESCRIPTOR, doc)
    return doc


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _int64_to_numbers(descriptor: Any, doc: dict[str, Any]) -> None:
    """Walk `doc` beside its message descriptor, turning only 64-bit integer fields to ints."""
    for field in descriptor.fields:
        value = doc.get(field.name)
        if value is None:
            continue
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            entry = message.fields_by_name["value"]
            for key, item in value.items():
                if entry.message_type is not None:
                    _int64_to_numbers(entry.message_type, item)
                elif entry.type in _INT64_TYPES:
                    value[key] = int(item)
        elif message is not None:
            for item in value if isinstance(value, list) else [value]:
                _int64_to_numbers(message, item)
        elif field.type in _INT64_TYPES:
            doc[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
