"""What inferd does with every field of Triton's `ModelConfig`: honoured, refused, or a hint.

One table, `FIELDS`, keyed by the field's path (`dynamic_batching.preferred_batch_size`;
repeated and map fields take their element's fields, as `instance_group.kind` or
`parameters.string_value`). `refused_fields` walks the fields a config *sets*, and the
config's validation fails the load at the first refused one, naming file and field: inferd
never accepts a setting it would ignore (issue #13). docs/model-config.md is generated from
this table, and a test walks the protobuf descriptor so that a field added upstream fails as
unclassified.

The rule for "set": a scalar at its default (`preserve_ordering: false`, `decoupled: false`)
is not set, so it is accepted even where the field is refused: its default is what inferd
does. A message is set when present, even empty; group messages whose presence changes
nothing (`response_cache { }`) are honoured and their fields decide.

Work in flight elsewhere flips an entry from `refused(...)` to `honoured(...)`: the reason
strings below name what is missing.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.config_field_rules import (
    CUDA_TUNING,
    ENSEMBLE,
    GROUP,
    QUEUE_POLICY,
    RAGGED_BACKENDS,
    RATE_LIMIT,
    SEQUENCE_INPUT_BACKENDS,
    TENSORRT,
    FieldRule,
    Status,
    each,
    format_check,
    gpus_check,
    hint,
    honoured,
    kind_check,
    refused,
)

FIELDS: dict[str, FieldRule] = {
    "name": honoured("must match the model's directory"),
    "platform": honoured(
        "onnxruntime_onnx, pytorch_libtorch or ensemble (docs/pipelines.md); others fail the load"
    ),
    "backend": honoured("onnxruntime, pytorch or python; others fail the load"),
    "runtime": refused("inferd picks the runtime from platform/backend; leave it unset"),
    "version_policy": honoured("which versions are served (default: the latest one)"),
    "version_policy.latest": honoured("the newest num_versions versions"),
    "version_policy.latest.num_versions": honoured("how many of the newest versions"),
    "version_policy.all": honoured("every version on disk"),
    "version_policy.specific": honoured("exactly the versions listed"),
    "version_policy.specific.versions": honoured("the versions to serve"),
    "max_batch_size": honoured(
        "0: requests run alone; N > 0: requests carry a batch dimension and are merged up "
        "to N rows (even without dynamic_batching: field lesson 4)"
    ),
    "input": honoured("the model's inputs, checked on every request"),
    "input.name": honoured("the input's name"),
    "input.data_type": honoured("checked against each request (and the ONNX file)"),
    "input.format": honoured(
        "reported in the config API for clients (Triton's image client reads it); needs 3 dims",
        check=format_check,
    ),
    "input.dims": honoured("checked on every request; -1 is any size"),
    "input.reshape": honoured("the shape the model sees"),
    "input.reshape.shape": honoured("the shape the model sees"),
    "input.is_shape_tensor": refused(TENSORRT),
    "input.allow_ragged_batch": honoured(
        "requests whose shapes of this input differ are batched together: the model gets "
        "their values concatenated in one dimension (docs/batching.md)",
        backends=RAGGED_BACKENDS,
    ),
    "input.optional": honoured("a request may leave the input out"),
    "input.is_non_linear_format_io": refused(TENSORRT),
    "output": honoured("the model's outputs, checked on every response"),
    "output.name": honoured("the output's name"),
    "output.data_type": honoured(
        "the model's output is converted to it within the same kind (float64 to FP32), else "
        "the request fails naming the output"
    ),
    "output.dims": honoured("checked on every response"),
    "output.reshape": honoured("the shape clients receive"),
    "output.reshape.shape": honoured("the shape clients receive"),
    "output.label_filename": honoured(
        "the labels of the classification extension: a file in the model directory (never "
        "outside it), one label per line (docs/classification.md)"
    ),
    "output.is_shape_tensor": refused(TENSORRT),
    "output.is_non_linear_format_io": refused(TENSORRT),
    "batch_input": honoured(
        "extra model inputs the server computes per batch (element counts, their running "
        "sums, item shapes), mostly to find the requests in a ragged input; a "
        "TritonPythonModel, which gets the requests unmerged, refuses it",
        backends=RAGGED_BACKENDS,
    ),
    "batch_input.kind": honoured(
        "all six of Triton's kinds (BATCH_ELEMENT_COUNT ... BATCH_ITEM_SHAPE_FLATTEN)",
        backends=RAGGED_BACKENDS,
    ),
    "batch_input.target_name": honoured(
        "the model input(s) that receive it; not declared in input", backends=RAGGED_BACKENDS
    ),
    "batch_input.data_type": honoured("TYPE_INT32 or TYPE_FP32", backends=RAGGED_BACKENDS),
    "batch_input.source_input": honoured(
        "the one input whose shapes it describes", backends=RAGGED_BACKENDS
    ),
    **each(
        refused(
            "batch outputs are not implemented: every output is split back by rows, each "
            "request getting as many rows as it sent"
        ),
        "batch_output",
        "batch_output.target_name",
        "batch_output.kind",
        "batch_output.source_input",
    ),
    "optimization": honoured(GROUP),
    "optimization.graph": honoured(GROUP),
    "optimization.graph.level": honoured(
        "ONNX Runtime's graph optimisation level: -1 basic, 1 extended, 2 none, else all",
        backends=("onnxruntime",),
    ),
    "optimization.priority": refused(TENSORRT),
    "optimization.cuda": honoured(GROUP),
    **each(
        refused(CUDA_TUNING),
        "optimization.cuda.graphs",
        "optimization.cuda.busy_wait_events",
        "optimization.cuda.graph_spec",
        "optimization.cuda.graph_spec.batch_size",
        "optimization.cuda.graph_spec.input",
        "optimization.cuda.graph_spec.input.dim",
        "optimization.cuda.graph_spec.graph_lower_bound",
        "optimization.cuda.graph_spec.graph_lower_bound.batch_size",
        "optimization.cuda.graph_spec.graph_lower_bound.input",
        "optimization.cuda.graph_spec.graph_lower_bound.input.dim",
        "optimization.cuda.output_copy_stream",
        "optimization.input_pinned_memory.enable",
        "optimization.output_pinned_memory.enable",
    ),
    "optimization.execution_accelerators": honoured(GROUP),
    **each(
        refused(
            "execution accelerators (TensorRT, OpenVINO) are not implemented; the ONNX "
            "backend uses the CUDA provider for KIND_GPU and the CPU provider otherwise"
        ),
        "optimization.execution_accelerators.gpu_execution_accelerator",
        "optimization.execution_accelerators.gpu_execution_accelerator.name",
        "optimization.execution_accelerators.gpu_execution_accelerator.parameters",
        "optimization.execution_accelerators.cpu_execution_accelerator",
        "optimization.execution_accelerators.cpu_execution_accelerator.name",
        "optimization.execution_accelerators.cpu_execution_accelerator.parameters",
    ),
    "optimization.input_pinned_memory": honoured(GROUP),
    "optimization.output_pinned_memory": honoured(GROUP),
    "optimization.gather_kernel_buffer_threshold": refused(CUDA_TUNING),
    "optimization.eager_batching": refused("the batcher does not prepare batches ahead"),
    "dynamic_batching": honoured("batching options (docs/batching.md)"),
    "dynamic_batching.preferred_batch_size": honoured(
        "a batch takes the largest preferred size the queue can fill"
    ),
    "dynamic_batching.max_queue_delay_microseconds": honoured(
        "the longest a request waits for company: the window of batching_policy `window`; "
        "the default policy never waits, so it always meets the bound"
    ),
    "dynamic_batching.preserve_ordering": refused(
        "responses leave as each batch finishes; with several instances a later request can "
        "be answered first"
    ),
    "dynamic_batching.priority_levels": honoured("requests' `priority` 1..N, 1 the highest"),
    "dynamic_batching.default_priority_level": honoured("the level of a request without one"),
    "dynamic_batching.default_queue_policy": honoured("admission of every level"),
    **{f"dynamic_batching.default_queue_policy.{k}": r for k, r in QUEUE_POLICY.items()},
    "dynamic_batching.priority_queue_policy": honoured("admission of one level"),
    **{f"dynamic_batching.priority_queue_policy.{k}": r for k, r in QUEUE_POLICY.items()},
    "sequence_batching": honoured(
        "the sequence batcher: each sequence on one instance and batch slot, its requests in "
        "order (docs/sequences.md)"
    ),
    "sequence_batching.direct": honoured(
        "the default strategy: batch row i is slot i, empty slots below a ready one get "
        "not-ready filler rows"
    ),
    "sequence_batching.direct.max_queue_delay_microseconds": honoured(
        "how long a batch may wait for minimum_slot_utilization (ignored while that is 0)"
    ),
    "sequence_batching.direct.minimum_slot_utilization": honoured(
        "the share of ready slots that lets a batch leave before the delay"
    ),
    "sequence_batching.oldest": honoured(
        "batches from the sequences with the oldest requests, at most one request each"
    ),
    "sequence_batching.oldest.max_candidate_sequences": honoured(
        "sequences per instance (default max_batch_size); the others wait in the backlog"
    ),
    "sequence_batching.oldest.preferred_batch_size": honoured(
        "the batch takes the largest preferred size its ready sequences fill"
    ),
    "sequence_batching.oldest.max_queue_delay_microseconds": honoured(
        "the longest a batch waits to fill up (default 0: never waits)"
    ),
    "sequence_batching.oldest.preserve_ordering": refused(
        "responses leave as each batch finishes; with several instances a later request can "
        "be answered first"
    ),
    "sequence_batching.max_sequence_idle_microseconds": honoured(
        "a sequence idle this long is released (default 1 s); later requests for it get 400"
    ),
    **each(
        honoured(
            "control inputs the server fills per batch row: START, END, READY, CORRID",
            backends=SEQUENCE_INPUT_BACKENDS,
        ),
        "sequence_batching.control_input",
        "sequence_batching.control_input.name",
        "sequence_batching.control_input.control",
        "sequence_batching.control_input.control.kind",
        "sequence_batching.control_input.control.int32_false_true",
        "sequence_batching.control_input.control.fp32_false_true",
        "sequence_batching.control_input.control.bool_false_true",
        "sequence_batching.control_input.control.data_type",
    ),
    "sequence_batching.iterative_sequence": refused(
        "iterative sequences (a model rescheduling its own requests) are not implemented"
    ),
    **each(
        honoured(
            "implicit state: the server keeps each sequence's state output and feeds it back "
            "as the state input",
            backends=SEQUENCE_INPUT_BACKENDS,
        ),
        "sequence_batching.state",
        "sequence_batching.state.input_name",
        "sequence_batching.state.output_name",
        "sequence_batching.state.data_type",
        "sequence_batching.state.dims",
        "sequence_batching.state.initial_state",
        "sequence_batching.state.initial_state.data_type",
        "sequence_batching.state.initial_state.dims",
        "sequence_batching.state.initial_state.zero_data",
        "sequence_batching.state.initial_state.data_file",
        "sequence_batching.state.initial_state.name",
    ),
    **each(
        refused("a GPU memory setting; inferd keeps implicit state in host memory"),
        "sequence_batching.state.use_same_buffer_for_input_output",
        "sequence_batching.state.use_growable_memory",
    ),
    **each(
        honoured(ENSEMBLE, backends=("ensemble",)),
        "ensemble_scheduling",
        "ensemble_scheduling.step",
        "ensemble_scheduling.step.model_name",
        "ensemble_scheduling.step.model_version",
        "ensemble_scheduling.step.input_map",
        "ensemble_scheduling.step.output_map",
    ),
    **each(
        refused("not implemented: inferd has no model namespaces"),
        "ensemble_scheduling.step.model_namespace",
    ),
    **each(
        refused(
            "not implemented; bound an ensemble's load with its composing models' queue policies"
        ),
        "ensemble_scheduling.max_inflight_requests",
    ),
    "instance_group": honoured("the model's instances, group by group"),
    "instance_group.name": honoured(
        "the group's name (Python models see it in model_instance_name)"
    ),
    "instance_group.kind": hint(
        "KIND_CPU; KIND_AUTO (a GPU where the backend sees one); KIND_GPU runs on a GPU where "
        "the backend sees one, else warns at load and runs on the CPU, and the config API and "
        "metrics report the kind and device actually used; KIND_MODEL is refused",
        check=kind_check,
    ),
    "instance_group.count": honoured("instances executing batches in parallel (default 1)"),
    **each(
        refused(RATE_LIMIT),
        "instance_group.rate_limiter",
        "instance_group.rate_limiter.resources",
        "instance_group.rate_limiter.resources.name",
        "instance_group.rate_limiter.resources.global",
        "instance_group.rate_limiter.resources.count",
        "instance_group.rate_limiter.priority",
    ),
    "instance_group.gpus": honoured(
        "the CUDA devices of a KIND_GPU/KIND_AUTO group, one per instance in turn",
        check=gpus_check,
    ),
    **each(
        refused("secondary devices (NVDLA) are not supported"),
        "instance_group.secondary_devices",
        "instance_group.secondary_devices.kind",
        "instance_group.secondary_devices.device_id",
    ),
    "instance_group.profile": refused(TENSORRT),
    "instance_group.passive": refused("every instance takes batches; passive ones are not kept"),
    "instance_group.host_policy": refused("host policies (NUMA binding) are not supported"),
    "default_model_filename": honoured(
        "accepted when it names the file inferd loads anyway (model.onnx, model.pt, "
        "model.pt2, model.py); other names are refused"
    ),
    "cc_model_filenames": refused("per-GPU model files are a TensorRT feature"),
    "metric_tags": refused("inferd adds no per-model metric labels (Triton reserves it too)"),
    "parameters": honoured(
        "inferd's and the backend's keys (below); unknown keys fail the load, except for "
        "Python models, which receive them"
    ),
    "parameters.string_value": honoured("the parameter's value"),
    "model_warmup": honoured("samples run on every instance before ready (docs/lifecycle.md)"),
    "model_warmup.name": honoured("names the sample in errors"),
    "model_warmup.batch_size": honoured("rows per sample (batching models)"),
    "model_warmup.inputs": honoured("one entry per input"),
    "model_warmup.inputs.data_type": honoured("the sample's datatype"),
    "model_warmup.inputs.dims": honoured("the sample's shape, without the batch dimension"),
    "model_warmup.inputs.zero_data": honoured("zeros (empty strings for BYTES)"),
    "model_warmup.inputs.random_data": honoured("random values (zeros for BOOL and BYTES)"),
    "model_warmup.inputs.input_data_file": honoured("raw bytes from `<model>/warmup/<file>`"),
    "model_warmup.count": honoured("how many times the sample runs"),
    **each(
        refused("custom operation libraries are not loaded"),
        "model_operations",
        "model_operations.op_library_filename",
    ),
    "model_transaction_policy": honoured(GROUP),
    "model_transaction_policy.decoupled": honoured(
        "zero or more responses per request, then the final flag, over gRPC ModelStreamInfer "
        "and HTTP generate_stream (docs/python-models.md#decoupled-models)",
        backends=("python",),
    ),
    **each(
        refused("repository agents are not implemented (checksums: see model_checksum)"),
        "model_repository_agents",
        "model_repository_agents.agents",
        "model_repository_agents.agents.name",
        "model_repository_agents.agents.parameters",
    ),
    "response_cache": honoured(GROUP),
    "response_cache.enable": honoured(
        "answers served from the response cache when the server has one (--cache-config); "
        "refused for decoupled and sequence-batched models (docs/cache.md)"
    ),
    **each(
        refused("per-model metric options are not implemented (docs/metrics.md)"),
        "model_metrics",
        "model_metrics.metric_control",
        "model_metrics.metric_control.metric_identifier",
        "model_metrics.metric_control.metric_identifier.family",
        "model_metrics.metric_control.histogram_options",
        "model_metrics.metric_control.histogram_options.buckets",
    ),
}


def refusal(path: str, rule: FieldRule, backend: str) -> str:
    """Why this backend refuses the field: "" when it is accepted."""
    if rule.status is Status.REFUSED:
        return rule.note
    if rule.backends and backend not in rule.backends:
        return (
            f"only the {' and '.join(rule.backends)} backend reads it; the {backend or 'no'} "
            "backend would ignore it"
        )
    return ""


def refused_fields(config: mc.ModelConfig, backend: str) -> list[tuple[str, str]]:
    """(field path, why) for every set field this backend refuses, in field order."""
    return _refusals(config, "", backend)


def _refusals(message: Message, prefix: str, backend: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for field, value in message.ListFields():
        path = prefix + field.name
        rule = FIELDS.get(path)
        if rule is None:  # a field newer than this table: never silently ignored
            found.append((path, "inferd does not know this field"))
            continue
        why = refusal(path, rule, backend) or (rule.check(message, value) if rule.check else "")
        if why:
            found.append((path, why))
            continue
        for child in _messages(field, value):
            found += _refusals(child, path + ".", backend)
    return found


def _messages(field: Any, value: Any) -> list[Message]:
    """The messages a set field holds: itself, its elements, or its map's values."""
    if field.message_type is None:
        return []
    if field.message_type.GetOptions().map_entry:
        is_message = field.message_type.fields_by_name["value"].message_type is not None
        return list(value.values()) if is_message else []
    if isinstance(value, Message):
        return [value]
    return list(value)
