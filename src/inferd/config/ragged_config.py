"""Ragged inputs and batch inputs (Triton's `allow_ragged_batch` and `batch_input`), read
from a model config and checked when the model loads.

A ragged input may differ in shape between the requests of one batch: the model receives
every request's values concatenated in one dimension, and batch inputs, tensors the server
computes per batch, tell it where each request's values start and end (docs/batching.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError
from inferd.config.padding_config import PaddingPlan, read_padding_plan

Kind = mc.BatchInput.Kind
ELEMENT_COUNT = Kind.BATCH_ELEMENT_COUNT
ACCUMULATED_ELEMENT_COUNT = Kind.BATCH_ACCUMULATED_ELEMENT_COUNT
ACCUMULATED_ELEMENT_COUNT_WITH_ZERO = Kind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO
MAX_ELEMENT_COUNT_AS_SHAPE = Kind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE
ITEM_SHAPE = Kind.BATCH_ITEM_SHAPE
ITEM_SHAPE_FLATTEN = Kind.BATCH_ITEM_SHAPE_FLATTEN

# Triton's rule: a batch input holds counts or shapes, as INT32 or FP32.
BATCH_INPUT_TYPES = {mc.TYPE_INT32: np.dtype(np.int32), mc.TYPE_FP32: np.dtype(np.float32)}


@dataclass(frozen=True, slots=True)
class BatchInputSpec:
    """One `batch_input` entry: a tensor computed from `source`'s shapes in the batch."""

    kind: int  # a `mc.BatchInput.Kind` value
    targets: tuple[str, ...]  # the model inputs that receive it (each gets the same values)
    dtype: np.dtype
    source: str

    @property
    def rank(self) -> int:
        """Dimensions of the tensor: [batch_size, dims] for BATCH_ITEM_SHAPE, else one."""
        return 2 if self.kind == ITEM_SHAPE else 1

    def describe(self) -> str:
        return f"a batch input ({Kind.Name(self.kind)} of '{self.source}')"


@dataclass(frozen=True, slots=True)
class RaggedPlan:
    """What the merge step does beyond concatenating rows; empty for most models."""

    ragged: frozenset[str] = frozenset()  # inputs concatenated flat across the batch
    batch_inputs: tuple[BatchInputSpec, ...] = ()
    padding: PaddingPlan | None = None  # inputs padded to the batch's longest member

    @property
    def active(self) -> bool:
        return bool(self.ragged or self.batch_inputs or self.padding)

    def targets(self) -> dict[str, str]:
        """Batch input name -> what it is (for the error a client sending one gets)."""
        return {t: spec.describe() for spec in self.batch_inputs for t in spec.targets}


NO_RAGGED = RaggedPlan()


def read_ragged_plan(config: mc.ModelConfig) -> RaggedPlan:
    """The config's ragged inputs and batch inputs; raises `ConfigError` naming the file and
    field when they are inconsistent (Triton's checks, and what inferd cannot honour)."""
    where = f"{config.name}/config.pbtxt"
    padding = read_padding_plan(config)
    ragged = [i for i in config.input if i.allow_ragged_batch]
    if not ragged and not config.batch_input:
        return NO_RAGGED if padding is None else RaggedPlan(padding=padding)
    if config.max_batch_size == 0:
        field = "input.allow_ragged_batch" if ragged else "batch_input"
        raise ConfigError(
            f"{where}: {field}: needs max_batch_size > 0 (a model that does not batch "
            "never merges requests)"
        )
    if config.HasField("sequence_batching"):
        field = "input.allow_ragged_batch" if ragged else "batch_input"
        raise ConfigError(
            f"{where}: {field}: not supported with sequence_batching (the sequence batcher "
            "merges only requests of equal shapes); use dynamic_batching"
        )
    for tensor in ragged:
        field = f"{where}: input '{tensor.name}': allow_ragged_batch"
        if tensor.optional:
            raise ConfigError(
                f"{field}: a ragged input cannot be optional (batch inputs count its "
                "elements in every request)"
            )
        if tensor.HasField("reshape"):
            raise ConfigError(
                f"{field}: a ragged input reaches the model flattened to one dimension, so "
                "its reshape would be ignored; remove the reshape"
            )
    inputs = {i.name: i for i in config.input}
    specs = [_batch_input(b, inputs, where) for b in config.batch_input]
    seen: set[str] = set()
    for spec in specs:
        for target in spec.targets:
            if target in seen:
                raise ConfigError(
                    f"{where}: batch_input.target_name: '{target}' is named by two batch inputs"
                )
            seen.add(target)
    return RaggedPlan(frozenset(i.name for i in ragged), tuple(specs), padding)


def _batch_input(
    entry: mc.BatchInput, inputs: dict[str, mc.ModelInput], where: str
) -> BatchInputSpec:
    if entry.kind not in Kind.values():
        raise ConfigError(f"{where}: batch_input.kind: unknown kind {entry.kind}")
    field = f"{where}: batch_input ({Kind.Name(entry.kind)})"
    targets = tuple(entry.target_name)
    if not targets or not all(targets):
        raise ConfigError(f"{field}: target_name must name the model input(s) it feeds")
    for target in targets:
        if target in inputs:
            raise ConfigError(
                f"{field}: target_name '{target}' is also declared in input; the server "
                "supplies a batch input, so leave it out of input"
            )
    dtype = BATCH_INPUT_TYPES.get(entry.data_type)
    if dtype is None:
        raise ConfigError(
            f"{field}: data_type {mc.DataType.Name(entry.data_type)} is not supported; a "
            "batch input is TYPE_INT32 or TYPE_FP32"
        )
    if len(entry.source_input) != 1:
        raise ConfigError(
            f"{field}: source_input must name exactly one input, got {len(entry.source_input)}"
        )
    source = entry.source_input[0]
    if source not in inputs:
        raise ConfigError(
            f"{field}: source_input '{source}' is not an input of the model; its inputs: "
            f"{', '.join(inputs) or '(none)'}"
        )
    if inputs[source].optional:
        raise ConfigError(
            f"{field}: source_input '{source}' is optional, but a batch input describes it "
            "in every request"
        )
    return BatchInputSpec(int(entry.kind), targets, dtype, source)
