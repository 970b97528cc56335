"""A Triton ensemble's graph (`platform: "ensemble"`, `ensemble_scheduling { step [...] }`),
read and checked at load.

Two passes, because the second needs the composing models loaded:

- `parse_graph` (the ensemble's own config): every step names a model; every tensor has one
  producer (an ensemble input or one step's output); every step input and ensemble output
  reads a tensor something produces; the steps form no cycle. It also records which steps
  each step waits for (the producers of the tensors it reads: the ensemble runs a step as soon
  as they are done) and orders the steps in waves (Kahn's levels: the cycle check, and the
  running order of a graph that is a chain).
- `check_composing` (each step's composing model's config): the mapped tensors exist, and
  where a tensor leaves one model and enters another (or leaves the ensemble) the datatypes
  are equal and the shapes compatible (-1 matches any size); the ensemble's max_batch_size is
  no larger than a composing model's (Triton's rule).

Every message names the ensemble, the step (1-based, with its model) and the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from inferd.datatypes import CONFIG_TO_V2

ENSEMBLE_PLATFORM = "ensemble"

# The fields an ensemble's config may set; any other is refused at load (an ensemble has no
# instances, batcher or backend of its own: its steps' models have them). response_cache:
# its own answers are cached, as Triton caches a top-level ensemble's (docs/cache.md).
ENSEMBLE_FIELDS = frozenset(
    {
        "name",
        "platform",
        "max_batch_size",
        "input",
        "output",
        "ensemble_scheduling",
        "version_policy",
        "response_cache",
    }
)


class GraphError(ValueError):
    """The ensemble's graph is wrong; the message names the step and tensor."""


@dataclass(frozen=True, slots=True)
class Step:
    number: int  # 1-based, as in messages: "step 2 (rank)"
    model: str
    version: str  # "" for model_version -1: the composing model's default version
    input_map: dict[str, str]  # the composing model's input -> the ensemble tensor it reads
    output_map: dict[str, str]  # the composing model's output -> the ensemble tensor it writes

    @property
    def label(self) -> str:
        return f"step {self.number} ({self.model})"


@dataclass(frozen=True, slots=True)
class EnsembleGraph:
    name: str
    steps: tuple[Step, ...]
    waves: tuple[tuple[Step, ...], ...]  # Kahn's levels: a step's producers are in earlier ones
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    producers: dict[str, Step | None]  # tensor -> the step writing it (None: an input)
    depends_on: dict[int, frozenset[int]]  # step -> the steps producing what it reads

    def is_chain(self, needed: frozenset[int]) -> bool:
        """Whether the `needed` steps can only run one after another (at most one per wave:
        each then reads the one before it), so the ensemble runs them without tasks."""
        return all(sum(s.number in needed for s in wave) <= 1 for wave in self.waves)

    def in_order(self, needed: frozenset[int]) -> list[Step]:
        """The `needed` steps in wave order (every step after its producers)."""
        return [s for wave in self.waves for s in wave if s.number in needed]

    def needed_steps(self, outputs: list[str]) -> frozenset[int]:
        """The numbers of the steps that `outputs` depend on (the others need not run)."""
        needed: set[int] = set()
        todo = list(outputs)
        while todo:
            step = self.producers.get(todo.pop())
            if step is not None and step.number not in needed:
                needed.add(step.number)
                todo.extend(step.input_map.values())
        return frozenset(needed)


def is_ensemble(config: mc.ModelConfig) -> bool:
    return bool(config.platform == ENSEMBLE_PLATFORM)


# The parameters an ensemble reads: its own cache's (the key of its answers: cache_ttl_seconds,
# cache_text_normalize, ...; cache/model_cache_spec.py reads and checks them).
ENSEMBLE_PARAMETER_PREFIX = "cache_"


def check_ensemble_fields(config: mc.ModelConfig, where: str) -> None:
    """Refuse what an ensemble would ignore (never accept what is not honoured)."""
    for field, _ in config.ListFields():
        if field.name == "parameters":
            for key in sorted(config.parameters):
                if not key.startswith(ENSEMBLE_PARAMETER_PREFIX):
                    raise GraphError(
                        f"{where}: parameters.{key}: not read for an ensemble (its steps' "
                        f"models have their own); an ensemble reads only its cache's "
                        f"{ENSEMBLE_PARAMETER_PREFIX}* parameters"
                    )
            continue
        if field.name not in ENSEMBLE_FIELDS:
            raise GraphError(
                f"{where}: {field.name}: not read for an ensemble (its steps' models have "
                "their own); an ensemble sets only "
                + ", ".join(sorted(ENSEMBLE_FIELDS | {"parameters (cache_*)"}))
            )
    scheduling = config.ensemble_scheduling
    if scheduling.max_inflight_requests:
        raise GraphError(
            f"{where}: ensemble_scheduling.max_inflight_requests: not implemented; bound "
            "the load with the composing models' queue policies"
        )


def parse_graph(config: mc.ModelConfig, where: str) -> EnsembleGraph:
    """The ensemble's steps, checked as a graph (see the module docstring)."""
    name = config.name
    prefix = f"{where}: ensemble '{name}'"
    if not config.HasField("ensemble_scheduling") or not config.ensemble_scheduling.step:
        raise GraphError(f"{where}: ensemble_scheduling: an ensemble needs at least one step")
    producers: dict[str, Step | None] = {t.name: None for t in config.input}
    steps: list[Step] = []
    for number, raw in enumerate(config.ensemble_scheduling.step, start=1):
        if not raw.model_name:
            raise GraphError(f"{prefix} step {number}: model_name is not set")
        if raw.model_name == name:
            raise GraphError(f"{prefix} step {number}: an ensemble cannot be its own step")
        if raw.model_namespace:
            raise GraphError(f"{prefix} step {number}: model_namespace: not implemented")
        if raw.model_version < -1 or raw.model_version == 0:
            raise GraphError(
                f"{prefix} step {number} ({raw.model_name}): model_version must be -1 "
                f"(the latest) or a version number, got {raw.model_version}"
            )
        version = "" if raw.model_version == -1 else str(raw.model_version)
        step = Step(number, raw.model_name, version, dict(raw.input_map), dict(raw.output_map))
        if not step.output_map:
            raise GraphError(f"{prefix} {step.label}: output_map is empty")
        for output, tensor in step.output_map.items():
            if tensor in producers:
                earlier = producers[tensor]
                by = "an ensemble input" if earlier is None else earlier.label
                raise GraphError(
                    f"{prefix} {step.label}: output '{output}' writes tensor '{tensor}', "
                    f"which {by} already produces; each tensor has one producer"
                )
            producers[tensor] = step
        steps.append(step)
    for step in steps:
        for model_input, tensor in step.input_map.items():
            if tensor not in producers:
                raise GraphError(
                    f"{prefix} {step.label}: input '{model_input}' reads tensor '{tensor}', "
                    "which no step produces and which is not an ensemble input"
                )
    for out in config.output:
        if out.name not in producers:
            raise GraphError(
                f"{prefix}: output '{out.name}': no step produces it (name it in a step's "
                "output_map)"
            )
        if producers[out.name] is None:
            raise GraphError(f"{prefix}: output '{out.name}' is an input; route it through a step")
    return EnsembleGraph(
        name=name,
        steps=tuple(steps),
        waves=_waves(steps, producers, prefix),
        inputs=tuple(t.name for t in config.input),
        outputs=tuple(t.name for t in config.output),
        producers=producers,
        depends_on={
            s.number: frozenset(
                p.number for t in s.input_map.values() if (p := producers[t]) is not None
            )
            for s in steps
        },
    )


def _waves(
    steps: list[Step], producers: dict[str, Step | None], prefix: str
) -> tuple[tuple[Step, ...], ...]:
    """The steps in waves (Kahn's order); a step left over sits on a cycle."""
    done: set[int] = set()
    waves: list[tuple[Step, ...]] = []
    left = list(steps)
    while left:
        wave = tuple(
            s for s in left if all(_ready(producers[t], done) for t in s.input_map.values())
        )
        if not wave:
            raise GraphError(f"{prefix}: the steps form a cycle: {_cycle(left, producers)}")
        waves.append(wave)
        done.update(s.number for s in wave)
        left = [s for s in left if s.number not in done]
    return tuple(waves)


def _ready(producer: Step | None, done: set[int]) -> bool:
    return producer is None or producer.number in done


def _cycle(left: list[Step], producers: dict[str, Step | None]) -> str:
    """One cycle among the steps left, as "step 1 (a) reads 't' from step 2 (b) ..."."""
    by_number = {s.number: s for s in left}
    step = left[0]
    seen: list[int] = []
    links: dict[int, tuple[str, Step]] = {}
    while step.number not in seen:
        seen.append(step.number)
        tensor, producer = next(
            (t, p)
            for t in step.input_map.values()
            if (p := producers[t]) is not None and p.number in by_number
        )
        links[step.number] = (tensor, producer)
        step = producer
    start = seen.index(step.number)
    parts = []
    for number in seen[start:]:
        tensor, producer = links[number]
        parts.append(f"{by_number[number].label} reads '{tensor}' from {producer.label}")
    return "; ".join(parts)


def _full_shape(dims: list[int], max_batch_size: int) -> list[int]:
    return ([-1] if max_batch_size > 0 else []) + [int(d) for d in dims]


def _compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _describe(dtype: int, shape: list[int]) -> str:
    return f"{CONFIG_TO_V2.get(dtype, str(dtype))} {shape}"


def check_composing(
    graph: EnsembleGraph, ensemble: mc.ModelConfig, composing: dict[int, mc.ModelConfig]
) -> None:
    """Check the graph against the composing models' configs (step number -> config)."""
    prefix = f"ensemble '{graph.name}'"
    # tensor -> (datatype, full shape, who produces it) as its producer declares it
    produced: dict[str, tuple[int, list[int], str]] = {
        t.name: (t.data_type, _full_shape(list(t.dims), ensemble.max_batch_size), "input")
        for t in ensemble.input
    }
    for step in graph.steps:
        config = composing[step.number]
        if config.model_transaction_policy.decoupled:
            raise GraphError(
                f"{prefix} {step.label}: model '{step.model}' is decoupled; an ensemble's "
                "step takes one response (decoupled steps are not implemented)"
            )
        if config.HasField("sequence_batching"):
            raise GraphError(
                f"{prefix} {step.label}: model '{step.model}' is a sequence model; passing "
                "sequence ids through an ensemble is not implemented"
            )
        if ensemble.max_batch_size > 0 and config.max_batch_size < ensemble.max_batch_size:
            raise GraphError(
                f"{prefix} {step.label}: the ensemble's max_batch_size "
                f"{ensemble.max_batch_size} exceeds model '{step.model}''s "
                f"{config.max_batch_size}; lower the ensemble's"
            )
        outputs = {t.name: t for t in config.output}
        for model_output, tensor in step.output_map.items():
            out = outputs.get(model_output)
            if out is None:
                raise GraphError(
                    f"{prefix} {step.label}: output_map names output '{model_output}', which "
                    f"model '{step.model}' does not have (it has {', '.join(outputs)})"
                )
            shape = _full_shape(list(out.dims), config.max_batch_size)
            produced[tensor] = (out.data_type, shape, f"{step.label} output '{model_output}'")
    for step in graph.steps:
        config = composing[step.number]
        inputs = {t.name: t for t in config.input}
        for model_input, tensor in step.input_map.items():
            spec = inputs.get(model_input)
            if spec is None:
                raise GraphError(
                    f"{prefix} {step.label}: input_map names input '{model_input}', which "
                    f"model '{step.model}' does not have (it has {', '.join(inputs)})"
                )
            shape = _full_shape(list(spec.dims), config.max_batch_size)
            _match(
                prefix,
                produced[tensor],
                tensor,
                spec.data_type,
                shape,
                f"{step.label} input '{model_input}'",
            )
        for spec in config.input:
            if spec.name not in step.input_map and not spec.optional:
                raise GraphError(
                    f"{prefix} {step.label}: model '{step.model}''s input '{spec.name}' is "
                    "not in input_map"
                )
    for out in ensemble.output:
        shape = _full_shape(list(out.dims), ensemble.max_batch_size)
        _match(
            prefix,
            produced[out.name],
            out.name,
            out.data_type,
            shape,
            f"the ensemble's output '{out.name}'",
        )


def _match(
    prefix: str,
    producer: tuple[int, list[int], str],
    tensor: str,
    dtype: int,
    shape: list[int],
    consumer: str,
) -> None:
    p_dtype, p_shape, by = producer
    if p_dtype != dtype or not _compatible(p_shape, shape):
        what = "datatype" if p_dtype != dtype else "shape"
        raise GraphError(
            f"{prefix}: tensor '{tensor}': {what} mismatch: {by} gives "
            f"{_describe(p_dtype, p_shape)}, {consumer} takes {_describe(dtype, shape)}"
        )
