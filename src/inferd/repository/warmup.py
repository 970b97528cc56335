"""Warm-up before ready (field lesson 6): run samples through every instance at load.

Samples come from Triton's `model_warmup` entries (zero, random or file data, a batch size,
a count) or, when the config gives none, from zeros at batch size 1 and at each preferred
batch size. Samples reach the model through the merge step, as a batch does (a ragged
model's sample of n rows as n requests of one row). A version becomes READY only after its
warm-up ran. A configured warm-up that
fails, or outputs that contradict the config, fail the load, so a version that cannot answer
never takes traffic; an automatic warm-up the model refuses is only a warning (`warm_up`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import AnyInstance, RequestInfoInstance, RequestListInstance
from inferd.config.model_config import ConfigError
from inferd.config.model_paths import confined
from inferd.datatypes import CONFIG_TO_V2, V2_TO_NUMPY
from inferd.errors import InferdError
from inferd.scheduling.merge import merged_inputs
from inferd.scheduling.readiness_probe import PROBE_ID
from inferd.scheduling.sequence.sequence_config import SequenceOptions
from inferd.streams import CollectingSink
from inferd.tensors.conformance import OutputMismatchError, conform_output
from inferd.tensors.signature import BoundRequest, ModelSignature
from inferd.tensors.wire_format import decode_bytes_elements
from inferd.types import SEQUENCE_END, SEQUENCE_START, Array

Sample = tuple[str, dict[str, Array], int]  # (name, inputs, count)


def warmup_samples(
    config: mc.ModelConfig,
    model_dir: Path,
    sequence: SequenceOptions | None = None,
    auto: bool = True,
) -> list[Sample]:
    """The samples; a sequence model's also carry the server's inputs (controls: a one-step
    sequence with correlation id 0; implicit state: the initial state). `auto`: the spec's
    `auto_warmup` (zeros when the config has no model_warmup)."""
    where = f"{config.name}/config.pbtxt"
    if config.model_warmup:
        samples = [_configured(w, config, model_dir, where) for w in config.model_warmup]
    elif not auto:
        return []
    else:
        sizes = [1]
        if config.max_batch_size > 0:
            sizes += sorted({int(s) for s in config.dynamic_batching.preferred_batch_size} - {1})
        samples = [
            (f"auto batch {size}", {t.name: _zeros(t, size, config) for t in config.input}, 1)
            for size in sizes
        ]
    if sequence is not None:
        for _, inputs, _ in samples:
            inputs.update(_sequence_inputs(sequence, inputs))
    return samples


def _sequence_inputs(sequence: SequenceOptions, inputs: dict[str, Array]) -> dict[str, Array]:
    extra = sequence.control_tensors(0, SEQUENCE_START | SEQUENCE_END)
    extra.update(sequence.initial_states())
    rows = next(iter(inputs.values())).shape[0] if sequence.batched and inputs else 1
    if rows == 1:
        return extra
    return {name: np.repeat(array, rows, axis=0) for name, array in extra.items()}


def _zeros(t: mc.ModelInput, batch: int, config: mc.ModelConfig) -> Array:
    # Samples go straight to the instances, so they take the shape the model itself sees.
    dims = t.reshape.shape if t.HasField("reshape") else t.dims
    shape = ([batch] if config.max_batch_size > 0 else []) + [d if d > 0 else 1 for d in dims]
    datatype = CONFIG_TO_V2[t.data_type]
    if datatype == "BYTES":
        array = np.empty(shape, dtype=object)
        array.fill(b"")
        return array
    return np.zeros(shape, dtype=V2_TO_NUMPY[datatype])


def _configured(w: mc.ModelWarmup, config: mc.ModelConfig, model_dir: Path, where: str) -> Sample:
    rng = np.random.default_rng(0)
    inputs: dict[str, Array] = {}
    declared = {t.name for t in config.input}
    for name, spec in w.inputs.items():
        field = f"{where}: model_warmup '{w.name}' input '{name}'"
        if name not in declared:
            raise ConfigError(f"{field}: the model has no such input")
        datatype = CONFIG_TO_V2.get(spec.data_type)
        if datatype is None:
            raise ConfigError(f"{field}: data_type is not supported")
        lead = [w.batch_size] if config.max_batch_size > 0 else []
        shape = lead + [int(d) for d in spec.dims]
        dtype = V2_TO_NUMPY[datatype]
        kind = spec.WhichOneof("input_data_type")
        if kind == "input_data_file":
            inputs[name] = _file_data(spec.input_data_file, model_dir, field, datatype, shape)
        elif kind == "random_data" and datatype not in ("BYTES", "BOOL"):
            if dtype.kind == "f":
                inputs[name] = rng.random(shape).astype(dtype)
            else:
                inputs[name] = rng.integers(0, 100, shape).astype(dtype)
        else:  # zero_data (and random BOOL/BYTES, which Triton also fills with zeros)
            if datatype == "BYTES":
                array = np.empty(shape, dtype=object)
                array.fill(b"")
                inputs[name] = array
            else:
                inputs[name] = np.zeros(shape, dtype=dtype)
    return (w.name or "warmup", inputs, max(1, int(w.count)))


@dataclass(frozen=True, slots=True)
class WarmupResult:
    samples: int
    warning: str = ""  # why an automatic warm-up did not finish; the version serves anyway
    # The first sample, which the model took: what readiness's probe executes until a
    # request succeeds (scheduling/readiness_probe.py). None: none to probe with.
    probe: BoundRequest | None = None


class WarmupError(Exception):
    """A warm-up failure that fails the load: a configured sample failed, or the model's
    outputs contradict its config."""


class _SampleFailedError(Exception):
    """A sample's execution raised (the model refused the input, or crashed on it)."""


def warm_up(
    instances: Sequence[AnyInstance],
    config: mc.ModelConfig,
    model_dir: Path,
    signature: ModelSignature,
    sequence: SequenceOptions | None = None,
    auto: bool = True,
) -> WarmupResult:
    """Warm every instance up before the version takes traffic.

    Triton's rule for a configured `model_warmup`: its failure fails the load. An automatic
    warm-up (zeros the config never asked for) that raises only means the model does not
    take zeros; that is a request-time limitation, so it is a warning and the version serves.
    Outputs that contradict the config fail the load either way: every request would fail.
    Raises `WarmupError`, or `ConfigError` for a malformed `model_warmup` section. A
    sequence model's samples are one-step sequences (flags SEQUENCE_START | SEQUENCE_END).
    """
    where = f"{config.name}/config.pbtxt"
    samples = warmup_samples(config, model_dir, sequence, auto)
    flags = SEQUENCE_START | SEQUENCE_END if sequence is not None else 0
    decoupled = config.model_transaction_policy.decoupled
    try:
        run_warmup(instances, samples, signature, flags, decoupled)
    except _SampleFailedError as exc:
        if config.model_warmup:
            raise WarmupError(
                f"{exc}; the model_warmup section of {where} must send inputs the model "
                "accepts (or fix the model)"
            ) from None
        return WarmupResult(
            len(samples),
            f"automatic warm-up failed, serving without it: {exc}; give {where} a "
            "model_warmup section with inputs the model accepts, or turn it off with "
            'parameters { key: "auto_warmup" value: { string_value: "false" } }',
        )
    probe = None if sequence is not None or decoupled else _probe_sample(samples, signature)
    return WarmupResult(len(samples), probe=probe)


def _probe_sample(samples: list[Sample], signature: ModelSignature) -> BoundRequest | None:
    """The first sample as one request, as a probe executes it; None when there is none, or
    when a ragged model takes it as several requests (run_warmup)."""
    if not samples:
        return None
    _, inputs, _ = samples[0]
    rows = next(iter(inputs.values())).shape[0] if signature.is_batched and inputs else 1
    if signature.ragged.active and rows > 1:
        return None
    return BoundRequest(inputs, rows, (), list(signature.outputs), PROBE_ID)


def _file_data(
    relative: str, model_dir: Path, field: str, datatype: str, shape: list[int]
) -> Array:
    """A sample from `<model>/warmup/<relative>`. Errors name the file and its size, never
    its bytes (the config, and so the path, may come from a client)."""
    path = confined(model_dir, relative, "warmup", f"{field}: input_data_file")
    if not path.is_file():
        raise ConfigError(f"{field}: {model_dir.name}/warmup/{relative} not found")
    raw = path.read_bytes()
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        try:
            return decode_bytes_elements(raw, count, field).reshape(shape)
        except InferdError:
            raise ConfigError(
                f"{field}: {model_dir.name}/warmup/{relative} ({len(raw)} bytes) is not "
                f"{count} BYTES elements in Triton's serialisation (4-byte length, bytes)"
            ) from None
    dtype = V2_TO_NUMPY[datatype]
    needed = count * dtype.itemsize
    if len(raw) < needed:
        raise ConfigError(
            f"{field}: {model_dir.name}/warmup/{relative} holds {len(raw)} bytes; shape "
            f"{shape} of {datatype} needs {needed}"
        )
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def run_warmup(
    instances: Sequence[AnyInstance],
    samples: list[Sample],
    signature: ModelSignature,
    flags: int = 0,
    decoupled: bool = False,
) -> None:
    """Execute every sample `count` times on every instance and check each answer's outputs
    against the config. Raises `_SampleFailedError` when an execution raises, `WarmupError` when
    an answer does not conform; both at the first failure. A decoupled model's answer is the
    responses it sent before its execution returned, each checked for the outputs it holds."""
    outputs = list(signature.outputs.values())
    for name, inputs, count in samples:
        rows = next(iter(inputs.values())).shape[0] if signature.is_batched and inputs else 1
        names = list(signature.outputs)
        request = BoundRequest(inputs, rows, (), names, "warmup", flags=flags)
        merged = [request]
        if signature.ragged.active and rows > 1:
            # A ragged model's batch of n rows is n requests of one row in service (each
            # with its entry in the batch inputs): warm it up with that batch.
            merged = [
                BoundRequest({k: a[i : i + 1] for k, a in inputs.items()}, 1, (), names, "warmup")
                for i in range(rows)
            ]
        model_inputs = merged_inputs(merged, signature.ragged)
        for instance in instances:
            for _ in range(count):
                try:
                    if isinstance(instance, RequestListInstance):
                        sink = CollectingSink()
                        request = BoundRequest(
                            inputs,
                            rows,
                            (),
                            list(signature.outputs),
                            "warmup",
                            flags=flags,
                            responses=sink,
                        )
                        (result,) = instance.execute_requests([request])
                        if isinstance(result, Exception):
                            raise result
                        if decoupled:
                            _check_responses(signature, sink, rows)
                            continue
                    elif isinstance(instance, RequestInfoInstance) and instance.wants_request_info:
                        result = instance.execute_with_requests(model_inputs, merged)
                    else:
                        result = instance.execute(model_inputs)
                    for spec in outputs:
                        conform_output(signature, spec, result, rows)
                except OutputMismatchError as exc:
                    raise WarmupError(f"warm-up '{name}': {exc.message}") from None
                except Exception as exc:
                    raise _SampleFailedError(f"warm-up '{name}' failed: {exc}") from None


def _check_responses(signature: ModelSignature, sink: CollectingSink, rows: int) -> None:
    for item in sink.items:
        if item.error is not None:
            raise item.error  # the model refused the sample (an error response)
        for spec in signature.outputs.values():
            if item.outputs is not None and spec.name in item.outputs:
                conform_output(signature, spec, item.outputs, rows)
