"""A model's `sequence_batching` section, read and checked once at load, and the tensors the
server feeds a stateful model beside the client's: control inputs and implicit state.

Triton's semantics (docs/sequences.md): each request of a sequence model belongs to one
sequence (its correlation id); the controls tell the model, per batch row, whether that row
starts or ends its sequence, whether the row holds a request at all (READY) and which
sequence it belongs to (CORRID); implicit state is a tensor the server keeps per sequence,
fed to the model as `input_name` and replaced after each step by its `output_name` output.
Fields inferd refuses outright (preserve_ordering, iterative_sequence, the state's GPU
memory settings, controls and state on other backends) are refused by
`config.fields` before this runs; here the values are checked for consistency.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import CONFIG_FILE, ConfigError
from inferd.datatypes import CONFIG_TO_V2, V2_TO_NUMPY
from inferd.types import SEQUENCE_END, SEQUENCE_START, Array

Control = mc.ModelSequenceBatching.Control
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds (0 = default)
CORRID_TYPES = {mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING}
CORRID_MAX = {"UINT64": 2**64 - 1, "INT64": 2**63 - 1, "UINT32": 2**32 - 1, "INT32": 2**31 - 1}
INITIAL_STATE_DIR = "initial_state"


@dataclass(frozen=True, slots=True)
class FlagControl:
    """START, END or READY: a model input holding `true` or `false` per batch row."""

    name: str
    datatype: str
    true: Array  # one request's tensor, read-only: [1, 1] when the model batches, else [1]
    false: Array


@dataclass(frozen=True, slots=True)
class CorridControl:
    name: str
    datatype: str  # UINT64, INT64, UINT32, INT32 or BYTES


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 is any size
    initial: Array  # one request's initial state (batch dimension included when batched)

    def matches(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.dims) and all(
            d in (-1, s) for d, s in zip(self.dims, shape, strict=True)
        )


@dataclass(frozen=True, slots=True)
class SequenceOptions:
    strategy: str  # "direct" or "oldest"
    idle_s: float  # a sequence with nothing queued for this long is released
    slots: int  # sequences per instance: batch slots (direct) or candidates (oldest)
    max_batch_size: int  # 0: the model does not batch (one slot of one row per batch)
    max_delay_s: float  # how long a batch may wait for more requests (0: never waits)
    min_slot_utilization: float  # direct: leave before the delay once this share is ready
    preferred_sizes: tuple[int, ...]  # oldest
    start: FlagControl | None
    end: FlagControl | None
    ready: FlagControl | None
    corrid: CorridControl | None
    states: tuple[StateSpec, ...]

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def has_controls(self) -> bool:
        return any(c is not None for c in (self.start, self.end, self.ready, self.corrid))

    def id_problem(self, correlation_id: int | str) -> str:
        """Why the CORRID control cannot carry this sequence id, or ""."""
        corrid = self.corrid
        if corrid is None or corrid.datatype == "BYTES":
            return ""
        control = f"its CONTROL_SEQUENCE_CORRID input '{corrid.name}' is {corrid.datatype}"
        if isinstance(correlation_id, str):
            return f"takes integer sequence ids ({control}), got the string '{correlation_id}'"
        most = CORRID_MAX[corrid.datatype]
        if correlation_id > most:
            return f"takes sequence ids up to {most} ({control}), got {correlation_id}"
        return ""

    @property
    def batch_rows(self) -> int:
        """The most requests one batch may hold (each sequence request is one row)."""
        return max(1, self.max_batch_size)

    def server_inputs(self) -> dict[str, str]:
        """Inputs the server supplies, never the client: name -> what it is."""
        named: dict[str, str] = {}
        for what, control in (
            ("CONTROL_SEQUENCE_START", self.start),
            ("CONTROL_SEQUENCE_END", self.end),
            ("CONTROL_SEQUENCE_READY", self.ready),
            ("CONTROL_SEQUENCE_CORRID", self.corrid),
        ):
            if control is not None:
                named[control.name] = f"the sequence control input {what}"
        for state in self.states:
            named[state.input_name] = "an implicit state input"
        return named

    def control_tensors(
        self, correlation_id: int | str, flags: int, ready: bool = True
    ) -> dict[str, Array]:
        """One request's control inputs (Triton's values; a filler row is not ready and has
        correlation id 0)."""
        tensors: dict[str, Array] = {}
        if self.start is not None:
            start = self.start
            tensors[start.name] = start.true if flags & SEQUENCE_START else start.false
        if self.end is not None:
            end = self.end
            tensors[end.name] = end.true if flags & SEQUENCE_END else end.false
        if self.ready is not None:
            tensors[self.ready.name] = self.ready.true if ready else self.ready.false
        if self.corrid is not None:
            shape = (1, 1) if self.batched else (1,)
            if self.corrid.datatype == "BYTES":
                value: object = str(correlation_id).encode() if correlation_id else b""
                tensors[self.corrid.name] = np.full(shape, value, dtype=object)
            else:
                tensors[self.corrid.name] = np.full(
                    shape, correlation_id, dtype=V2_TO_NUMPY[self.corrid.datatype]
                )
        return tensors

    def initial_states(self) -> dict[str, Array]:
        return {s.input_name: s.initial for s in self.states}


def read_sequence_options(config: mc.ModelConfig, model_dir: Path) -> SequenceOptions | None:
    """The config's sequence batching, or None when it has none; raises `ConfigError` naming
    the file and the field. Reads initial-state data files: call it off the event loop."""
    if not config.HasField("sequence_batching"):
        return None
    where = f"{model_dir.name}/{CONFIG_FILE}: sequence_batching"
    sb = config.sequence_batching
    batched = config.max_batch_size > 0
    slots = max(1, int(config.max_batch_size))
    max_delay_us = 0
    utilization = 0.0
    preferred: tuple[int, ...] = ()
    strategy = "oldest" if sb.HasField("oldest") else "direct"
    if strategy == "direct":
        max_delay_us = int(sb.direct.max_queue_delay_microseconds)
        utilization = float(sb.direct.minimum_slot_utilization)
        if not 0.0 <= utilization <= 1.0:
            raise ConfigError(
                f"{where}.direct.minimum_slot_utilization: must be within 0..1, got {utilization}"
            )
    else:
        oldest = sb.oldest
        if oldest.max_candidate_sequences < 0:
            raise ConfigError(
                f"{where}.oldest.max_candidate_sequences: must be >= 0, got "
                f"{oldest.max_candidate_sequences}"
            )
        if oldest.max_candidate_sequences > 0:
            slots = int(oldest.max_candidate_sequences)
        for size in oldest.preferred_batch_size:
            if not 1 <= size <= max(1, config.max_batch_size):
                raise ConfigError(
                    f"{where}.oldest.preferred_batch_size: {size} must be within "
                    f"1..max_batch_size ({config.max_batch_size})"
                )
        preferred = tuple(int(s) for s in oldest.preferred_batch_size)
        max_delay_us = int(oldest.max_queue_delay_microseconds)
    client_inputs = {i.name for i in config.input}
    flags, corrid = _controls(sb, where, batched, client_inputs)
    control_names = {f.name for f in flags.values()} | ({corrid.name} if corrid else set())
    states = _states(sb, where, batched, model_dir, config, client_inputs | control_names)
    idle_us = int(sb.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
    return SequenceOptions(
        strategy=strategy,
        idle_s=idle_us / 1e6,
        slots=slots,
        max_batch_size=int(config.max_batch_size),
        max_delay_s=max_delay_us / 1e6,
        min_slot_utilization=utilization,
        preferred_sizes=preferred,
        start=flags.get(Control.CONTROL_SEQUENCE_START),
        end=flags.get(Control.CONTROL_SEQUENCE_END),
        ready=flags.get(Control.CONTROL_SEQUENCE_READY),
        corrid=corrid,
        states=states,
    )


def _controls(
    sb: mc.ModelSequenceBatching, where: str, batched: bool, client_inputs: set[str]
) -> tuple[dict[int, FlagControl], CorridControl | None]:
    flags: dict[int, FlagControl] = {}
    corrid: CorridControl | None = None
    seen_names: set[str] = set()
    seen_kinds: set[int] = set()
    shape = (1, 1) if batched else (1,)
    for ci in sb.control_input:
        field = f"{where}.control_input '{ci.name}'"
        if not ci.name:
            raise ConfigError(f"{where}.control_input: every control input needs a name")
        if ci.name in seen_names:
            raise ConfigError(f"{field}: declared twice")
        if ci.name in client_inputs:
            raise ConfigError(
                f"{field}: also declared under input; the server supplies control inputs, so "
                "they are not listed as inputs"
            )
        seen_names.add(ci.name)
        if len(ci.control) != 1:
            raise ConfigError(f"{field}: must hold exactly one control, got {len(ci.control)}")
        control = ci.control[0]
        kind_name = Control.Kind.Name(control.kind)
        if control.kind in seen_kinds:
            raise ConfigError(f"{field}: a second {kind_name} control; a model has at most one")
        seen_kinds.add(control.kind)
        lists = [
            (name, list(values))
            for name, values in (
                ("int32_false_true", control.int32_false_true),
                ("fp32_false_true", control.fp32_false_true),
                ("bool_false_true", control.bool_false_true),
            )
            if values
        ]
        if control.kind == Control.CONTROL_SEQUENCE_CORRID:
            if lists:
                raise ConfigError(f"{field}: {kind_name} takes data_type, not {lists[0][0]}")
            if control.data_type not in CORRID_TYPES:
                raise ConfigError(
                    f"{field}: {kind_name} data_type must be one of TYPE_UINT64, TYPE_INT64, "
                    f"TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got "
                    f"{mc.DataType.Name(control.data_type)}"
                )
            corrid = CorridControl(ci.name, CONFIG_TO_V2[control.data_type])
            continue
        if control.data_type != mc.TYPE_INVALID:
            raise ConfigError(
                f"{field}: {kind_name} takes one of int32_false_true, fp32_false_true or "
                "bool_false_true, not data_type"
            )
        if len(lists) != 1 or len(lists[0][1]) != 2:
            raise ConfigError(
                f"{field}: {kind_name} needs exactly one of int32_false_true, fp32_false_true "
                "or bool_false_true, with two values: [false, true]"
            )
        list_name, (false_value, true_value) = lists[0]
        datatype = {"int32_false_true": "INT32", "fp32_false_true": "FP32"}.get(list_name, "BOOL")
        dtype = V2_TO_NUMPY[datatype]
        true = np.full(shape, true_value, dtype=dtype)
        false = np.full(shape, false_value, dtype=dtype)
        true.flags.writeable = False  # shared by every request: never written
        false.flags.writeable = False
        flags[control.kind] = FlagControl(ci.name, datatype, true, false)
    return flags, corrid


def _states(
    sb: mc.ModelSequenceBatching,
    where: str,
    batched: bool,
    model_dir: Path,
    config: mc.ModelConfig,
    taken: set[str],
) -> tuple[StateSpec, ...]:
    states: list[StateSpec] = []
    inputs: set[str] = set()
    outputs: set[str] = set()
    declared_outputs = {o.name: o for o in config.output}
    for st in sb.state:
        field = f"{where}.state '{st.input_name}'"
        if not st.input_name or not st.output_name:
            raise ConfigError(f"{where}.state: every state needs input_name and output_name")
        if st.input_name in taken or st.input_name in inputs:
            raise ConfigError(
                f"{field}: input_name is already an input, a control input or another state"
            )
        if st.output_name in outputs:
            raise ConfigError(f"{field}: output_name '{st.output_name}' is another state's too")
        inputs.add(st.input_name)
        outputs.add(st.output_name)
        if st.data_type not in CONFIG_TO_V2 or st.data_type == mc.TYPE_STRING:
            raise ConfigError(
                f"{field}: data_type {mc.DataType.Name(st.data_type)} is not supported for "
                "implicit state"
            )
        datatype = CONFIG_TO_V2[st.data_type]
        dims = tuple(int(d) for d in st.dims)
        if not dims or any(d < -1 or d == 0 for d in dims):
            raise ConfigError(f"{field}: dims {list(dims)} must list positive sizes or -1")
        listed = declared_outputs.get(st.output_name)
        if listed is not None and (
            listed.data_type != st.data_type or len(listed.dims) != len(dims)
        ):
            raise ConfigError(
                f"{field}: output '{st.output_name}' is declared under output with another "
                "data_type or rank than the state's"
            )
        initial = _initial_state(st, field, datatype, dims, model_dir)
        if batched:
            initial = initial.reshape((1, *initial.shape))
        initial.flags.writeable = False  # shared by every sequence that starts
        states.append(StateSpec(st.input_name, st.output_name, datatype, dims, initial))
    return tuple(states)


def _initial_state(
    st: mc.ModelSequenceBatching.State,
    field: str,
    datatype: str,
    dims: tuple[int, ...],
    model_dir: Path,
) -> Array:
    dtype = V2_TO_NUMPY[datatype]
    if not st.initial_state:
        # Triton leaves the first state uninitialised (1 for variable dims); zeros are the
        # same shape and make a model that ignores START deterministic.
        return np.zeros(tuple(1 if d == -1 else d for d in dims), dtype=dtype)
    if len(st.initial_state) > 1:
        raise ConfigError(f"{field}.initial_state: at most one initial state per state")
    init = st.initial_state[0]
    where = f"{field}.initial_state"
    if init.data_type != st.data_type:
        raise ConfigError(
            f"{where}: data_type {mc.DataType.Name(init.data_type)} differs from the state's "
            f"{mc.DataType.Name(st.data_type)}"
        )
    shape = tuple(int(d) for d in init.dims)
    if any(d < 1 for d in shape):
        raise ConfigError(f"{where}: dims {list(shape)} must be fixed positive sizes")
    if len(shape) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, shape, strict=True)):
        raise ConfigError(f"{where}: dims {list(shape)} do not fit the state's dims {list(dims)}")
    which = init.WhichOneof("state_data")
    if which == "zero_data" and init.zero_data:
        return np.zeros(shape, dtype=dtype)
    if which == "data_file" and init.data_file:
        path = model_dir / INITIAL_STATE_DIR / init.data_file
        relative = f"{model_dir.name}/{INITIAL_STATE_DIR}/{init.data_file}"
        if model_dir.resolve() not in path.resolve().parents or not path.is_file():
            raise ConfigError(f"{where}: data_file {relative} not found")
        raw = path.read_bytes()
        want = int(np.prod(shape)) * dtype.itemsize
        if len(raw) != want:
            raise ConfigError(
                f"{where}: data_file {relative} holds {len(raw)} bytes; dims {list(shape)} of "
                f"{datatype} need {want}"
            )
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    raise ConfigError(f"{where}: set zero_data: true or a data_file")
