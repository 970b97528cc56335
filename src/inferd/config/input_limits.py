"""Per-model input limits from a config's `parameters` (docs/limits.md), parsed once at load
into `InputLimits`; `ModelSignature.bind` checks each request against them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError, parameter

# Per-input limits a model config may set as `parameters` (docs/limits.md). They are checked
# in `bind`, so HTTP and gRPC share them, on the declared shape: nothing is allocated from it.
MAX_INPUT_SHAPE = "max_input_shape"  # JSON: {"INPUT0": [512, -1]}, non-batch dims, -1 = any
MAX_INPUT_ELEMENTS = "max_input_elements"  # elements per input tensor, batch included
MAX_BYTES_ELEMENT_SIZE = "max_bytes_element_size"  # bytes per BYTES element
DEFAULT_MAX_INPUT_ELEMENTS = 2**26  # 67,108,864: 256 MiB of FP32
DEFAULT_MAX_BYTES_ELEMENT_SIZE = 16 * 2**20  # 16 MiB


def _dims(spec_dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in spec_dims)


@dataclass(frozen=True, slots=True)
class InputLimits:
    """What one request may send per input; read from the config's `parameters`."""

    max_shape: dict[str, tuple[int, ...]] = field(default_factory=dict)  # -1: no bound
    max_elements: int = DEFAULT_MAX_INPUT_ELEMENTS
    max_bytes_element_size: int = DEFAULT_MAX_BYTES_ELEMENT_SIZE


def _positive_int_parameter(config: mc.ModelConfig, key: str, default: int, where: str) -> int:
    if key not in config.parameters:
        return default
    raw = parameter(config, key).strip()
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{where}: {key}: '{raw}' is not an integer") from None
    if value < 1:
        raise ConfigError(f"{where}: {key}: must be >= 1, got {value}")
    return value


def read_limits(config: mc.ModelConfig) -> InputLimits:
    """The config's input limits; raises `ConfigError` naming the parameter when malformed.

    `parse_spec` calls it when a model loads, so a bad limit fails the load instead of the
    first request.
    """
    where = f"{config.name}/config.pbtxt: parameters"
    dims = {i.name: _dims(i.dims) for i in config.input}
    max_shape: dict[str, tuple[int, ...]] = {}
    if MAX_INPUT_SHAPE in config.parameters:
        raw = parameter(config, MAX_INPUT_SHAPE)
        field_where = f"{where}: {MAX_INPUT_SHAPE}"
        try:
            doc: Any = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{field_where}: malformed JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(
                f'{field_where}: must be a JSON object of input name -> list, e.g. {{"IN": [512]}}'
            )
        for name, bound in doc.items():
            if name not in dims:
                raise ConfigError(
                    f"{field_where}: the model has no input '{name}'; its inputs: "
                    f"{', '.join(dims) or '(none)'}"
                )
            if not isinstance(bound, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and (d >= 1 or d == -1)
                for d in bound
            ):
                raise ConfigError(
                    f"{field_where}: '{name}' must be a list of positive integers (or -1 for "
                    f"no bound), got {bound!r}"
                )
            if len(bound) != len(dims[name]):
                raise ConfigError(
                    f"{field_where}: '{name}' gives {len(bound)} dimensions, but its dims "
                    f"{list(dims[name])} have {len(dims[name])} (leave out the batch dimension)"
                )
            for d, m in zip(dims[name], bound, strict=True):
                if d != -1 and m != -1 and m < d:
                    raise ConfigError(
                        f"{field_where}: '{name}' bound {bound} is below its fixed dims "
                        f"{list(dims[name])}: no request could pass"
                    )
            max_shape[name] = tuple(bound)
    return InputLimits(
        max_shape=max_shape,
        max_elements=_positive_int_parameter(
            config, MAX_INPUT_ELEMENTS, DEFAULT_MAX_INPUT_ELEMENTS, where
        ),
        max_bytes_element_size=_positive_int_parameter(
            config, MAX_BYTES_ELEMENT_SIZE, DEFAULT_MAX_BYTES_ELEMENT_SIZE, where
        ),
    )
