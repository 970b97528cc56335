"""Padding to the batch's longest member (inferd's `pad_inputs` and `padded_outputs`), read
from a model config and checked when the model loads.

Triton merges only requests whose inputs have equal shapes, so requests of different lengths
(sentences, token sequences) execute apart. A model whose inputs have one variable dimension
that padding does not change the meaning of (token ids with an attention mask) can declare it:
requests of any length then batch together, each input is padded with its pad value to the
longest member of the batch, and the outputs that carry that dimension are cut back to each
request's own length (docs/batching.md, "Padding").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError, parameter

# Integer and boolean pad values must be integers; floating-point ones may be any number.
_INTEGER_TYPES = {
    mc.TYPE_BOOL: (0, 1),
    mc.TYPE_UINT8: (0, 2**8 - 1),
    mc.TYPE_UINT16: (0, 2**16 - 1),
    mc.TYPE_UINT32: (0, 2**32 - 1),
    mc.TYPE_UINT64: (0, 2**64 - 1),
    mc.TYPE_INT8: (-(2**7), 2**7 - 1),
    mc.TYPE_INT16: (-(2**15), 2**15 - 1),
    mc.TYPE_INT32: (-(2**31), 2**31 - 1),
    mc.TYPE_INT64: (-(2**63), 2**63 - 1),
}
_FLOAT_TYPES = {mc.TYPE_FP16, mc.TYPE_FP32, mc.TYPE_FP64, mc.TYPE_BF16}


@dataclass(frozen=True, slots=True)
class PadInput:
    """An input padded to the batch's longest member along `axis` (of the request's array:
    0 is the batch dimension) with `value`."""

    name: str
    axis: int
    value: int | float


@dataclass(frozen=True, slots=True, eq=False)
class PaddingPlan:
    inputs: tuple[PadInput, ...]
    # Output name -> the axis (of the model's output array) cut back to each request's length.
    outputs: dict[str, int]

    @property
    def first(self) -> PadInput:
        """The input whose length is the request's length (all padded inputs agree)."""
        return self.inputs[0]


def read_padding_plan(config: mc.ModelConfig) -> PaddingPlan | None:
    """The config's `pad_inputs` and `padded_outputs`, or None when it pads nothing; raises
    `ConfigError` naming the file and key when a model cannot take them."""
    where = f"{config.name}/config.pbtxt: parameters"
    raw = parameter(config, "pad_inputs").strip()
    raw_outputs = parameter(config, "padded_outputs").strip()
    if not raw:
        if raw_outputs:
            raise ConfigError(
                f"{where}.padded_outputs: needs pad_inputs (the inputs padded to the batch's "
                "longest member, whose length the outputs are cut back to)"
            )
        return None
    field = f"{where}.pad_inputs"
    if config.platform == "ensemble":
        raise ConfigError(
            f"{field}: an ensemble executes no batch of its own; set pad_inputs on the step "
            "model that batches"
        )
    if config.max_batch_size == 0:
        raise ConfigError(
            f"{field}: needs max_batch_size > 0 (a model that does not batch is never padded)"
        )
    if config.HasField("sequence_batching"):
        raise ConfigError(
            f"{field}: not supported with sequence_batching (the sequence batcher merges only "
            "requests of equal shapes); use dynamic_batching"
        )
    declared = {i.name: i for i in config.input}
    inputs: list[PadInput] = []
    for item in raw.split(","):
        name, _, value = (part.strip() for part in item.partition(":"))
        if not name:
            raise ConfigError(f"{field}: '{raw}' must be `input:pad_value, ...`")
        tensor = declared.get(name)
        if tensor is None:
            raise ConfigError(
                f"{field}: '{name}' is not an input of the model; its inputs: "
                f"{', '.join(declared) or '(none)'}"
            )
        if any(p.name == name for p in inputs):
            raise ConfigError(f"{field}: '{name}' is named twice")
        axis = _axis(tensor, f"{field}: input '{name}'")
        inputs.append(PadInput(name, axis, _pad_value(tensor, value or "0", field)))
    outputs: dict[str, int] = {}
    declared_outputs = {o.name: o for o in config.output}
    for name in (n.strip() for n in raw_outputs.split(",") if n.strip()):
        out = declared_outputs.get(name)
        field = f"{where}.padded_outputs"
        if out is None:
            raise ConfigError(
                f"{field}: '{name}' is not an output of the model; its outputs: "
                f"{', '.join(declared_outputs) or '(none)'}"
            )
        outputs[name] = _axis(out, f"{field}: output '{name}'")
    return PaddingPlan(tuple(inputs), outputs)


def _axis(tensor: mc.ModelInput | mc.ModelOutput, field: str) -> int:
    """The one variable dimension of `tensor`, as an axis of its batched array."""
    if tensor.data_type == mc.TYPE_STRING:
        raise ConfigError(f"{field}: a BYTES tensor has no pad value; pad numbers only")
    if isinstance(tensor, mc.ModelInput):
        if tensor.allow_ragged_batch:
            raise ConfigError(
                f"{field}: is also allow_ragged_batch; an input is padded or ragged, not both"
            )
        if tensor.optional:
            raise ConfigError(f"{field}: cannot be optional (every request has a length)")
    if tensor.HasField("reshape"):
        raise ConfigError(
            f"{field}: has a reshape; padding works on the dims the model sees, remove it"
        )
    variable = [k for k, d in enumerate(tensor.dims) if d == -1]
    if len(variable) != 1:
        raise ConfigError(
            f"{field}: needs exactly one variable dimension (-1) in dims, the one padded; "
            f"dims are {list(tensor.dims)}"
        )
    return variable[0] + 1  # after the batch dimension


def _pad_value(tensor: mc.ModelInput, raw: str, field: str) -> int | float:
    name = tensor.name
    bounds = _INTEGER_TYPES.get(tensor.data_type)
    if bounds is not None:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(
                f"{field}: the pad value of '{name}' ({mc.DataType.Name(tensor.data_type)}) "
                f"must be an integer, got '{raw}'"
            ) from None
        if not bounds[0] <= value <= bounds[1]:
            raise ConfigError(
                f"{field}: the pad value of '{name}' ({value}) is outside "
                f"{mc.DataType.Name(tensor.data_type)}'s range"
            )
        return value
    if tensor.data_type in _FLOAT_TYPES:
        try:
            number = float(raw)
        except ValueError:
            raise ConfigError(
                f"{field}: the pad value of '{name}' must be a number, got '{raw}'"
            ) from None
        if not np.isfinite(number):
            raise ConfigError(f"{field}: the pad value of '{name}' must be finite, got '{raw}'")
        return number
    raise ConfigError(  # pragma: no cover - every numeric type is above
        f"{field}: '{name}' has type {mc.DataType.Name(tensor.data_type)}, which is not padded"
    )
