"""Nothing in a config is silently ignored: every `ModelConfig` field is classified, refused
fields fail the load naming file and field, and docs/model-config.md says what the code does."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config import config_docs as field_docs
from inferd.config.config_fields import FIELDS
from inferd.config.config_parameters import (
    BACKEND_PARAMETERS,
    INFERD_PARAMETERS,
)
from inferd.config.model_config import ConfigError, to_json
from inferd.repository.loader import parse_config_override, prepare
from tests.support.config_models import LINEAR_CONFIG, make_model, prepare_error
from tests.support.models import builders

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "inferd"


def _descriptor_paths(descriptor: Any, prefix: str = "") -> list[str]:
    """Walked here, not with field_docs' walk, so the test checks the code independently."""
    paths = []
    for field in descriptor.fields:
        path = prefix + field.name
        paths.append(path)
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            message = message.fields_by_name["value"].message_type
        if message is not None:
            paths += _descriptor_paths(message, path + ".")
    return paths


# -- the classification is complete and the docs agree ----------------------------------------


def test_every_model_config_field_is_classified() -> None:
    paths = _descriptor_paths(mc.ModelConfig.DESCRIPTOR)
    unclassified = [p for p in paths if p not in FIELDS]
    assert not unclassified, f"ModelConfig fields missing from fields.FIELDS: {unclassified}"
    stale = [p for p in FIELDS if p not in paths]
    assert not stale, f"fields.FIELDS names fields ModelConfig lacks: {stale}"


def test_refused_fields_say_why() -> None:
    for path, rule in FIELDS.items():
        assert rule.note.strip(), f"{path}: no note"


def test_the_docs_tables_are_the_codes() -> None:
    page = (ROOT / "docs" / "model-config.md").read_text(encoding="utf-8")
    assert field_docs.rewrite(page) == page, (
        "docs/model-config.md is out of date: run "
        "`python -m inferd.config.config_docs docs/model-config.md`"
    )
    assert "**unclassified**" not in page


# The spec parser's readers of one key (or a tuple of keys), given as their second argument.
_READERS = (
    "parameter",
    "int_parameter",
    "_positive_int_parameter",
    "_optional_int",
    "_bounded_parameter",
    "_seconds_parameter",
    "_int_in_range_parameter",
    "_number",
)


def _keys_read_in(path: Path) -> set[str]:
    """Config parameter keys the module reads: `parameter(config, "k")`, `int_parameter(config,
    ("A", "b"), ...)`, `config.parameters["k"]`, `"k" in config.parameters`, with module
    constants (`KEY = "k"`) resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name) and isinstance(node.value.value, str)
    }

    def strings(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and node.id in constants:
            return [constants[node.id]]
        if isinstance(node, ast.Tuple):
            return [s for e in node.elts for s in strings(e)]
        return []

    def is_config_parameters(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "parameters"
            and ast.unparse(node.value).endswith("config")
        )

    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).rsplit(".", 1)[-1]
            if name in _READERS and node.args:
                keys.update(s for arg in node.args[1:2] for s in strings(arg))
        elif isinstance(node, ast.Subscript) and is_config_parameters(node.value):
            keys.update(strings(node.slice))
        elif isinstance(node, ast.Compare) and any(
            is_config_parameters(c) for c in node.comparators
        ):
            keys.update(strings(node.left))
    return keys


def test_every_parameter_key_the_source_reads_is_listed() -> None:
    read = set().union(*(_keys_read_in(p) for p in SRC.rglob("*.py")))
    listed = {*INFERD_PARAMETERS, *(k for keys in BACKEND_PARAMETERS.values() for k in keys)}
    assert read - listed == set(), "keys read in src/ but not in config/config_parameters.py"
    assert listed - read == set(), "keys in config/config_parameters.py that nothing reads"
    assert {"batching_policy", "max_input_shape", "isolation", "torch_compile"} <= read


# -- refused fields fail the load, naming file and field --------------------------------------

# (id, config text appended to an ONNX model's config, the field path the error names)
REFUSED = [
    (
        "iterative sequence",
        "sequence_batching { iterative_sequence: true }",
        "sequence_batching.iterative_sequence",
    ),
    (
        "ordered sequence responses",
        "sequence_batching { oldest { preserve_ordering: true } }",
        "sequence_batching.oldest.preserve_ordering",
    ),
    ("decoupled", "model_transaction_policy { decoupled: true }", "model_transaction_policy"),
    (
        "ensemble steps",
        'ensemble_scheduling { step [ { model_name: "a" } ] }',
        "ensemble_scheduling",
    ),
    (
        "batch output",
        'batch_output [ { target_name: "y", source_input: "x" } ]',
        "batch_output",
    ),
    (
        "preserve ordering",
        "dynamic_batching { preserve_ordering: true }",
        "dynamic_batching.preserve_ordering",
    ),
    (
        "queue DELAY with a timeout",
        "dynamic_batching { default_queue_policy { timeout_action: DELAY, "
        "default_timeout_microseconds: 1000 } }",
        "dynamic_batching.default_queue_policy.timeout_action",
    ),
    (
        "priority queue DELAY overridable",
        "dynamic_batching { priority_levels: 2, priority_queue_policy { key: 1, value: { "
        "timeout_action: DELAY, allow_timeout_override: true } } }",
        "dynamic_batching.priority_queue_policy.timeout_action",
    ),
    (
        "execution accelerator",
        'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" '
        "} ] } }",
        "optimization.execution_accelerators.gpu_execution_accelerator",
    ),
    ("cuda graphs", "optimization { cuda { graphs: true } }", "optimization.cuda.graphs"),
    (
        "pinned memory",
        "optimization { input_pinned_memory { enable: true } }",
        "optimization.input_pinned_memory.enable",
    ),
    ("KIND_MODEL", "instance_group [ { kind: KIND_MODEL } ]", "instance_group.kind"),
    (
        "gpus on a CPU group",
        "instance_group [ { kind: KIND_CPU, gpus: [ 0 ] } ]",
        "instance_group.gpus",
    ),
    (
        "rate limiter",
        'instance_group [ { rate_limiter { resources [ { name: "R", count: 1 } ] } } ]',
        "instance_group.rate_limiter",
    ),
    ("passive instances", "instance_group [ { passive: true } ]", "instance_group.passive"),
    ("metric tags", 'metric_tags { key: "team" value: "a" }', "metric_tags"),
    ("runtime", 'runtime: "libtriton_onnxruntime.so"', "runtime"),
    (
        "model operations",
        'model_operations { op_library_filename: [ "ops.so" ] }',
        "model_operations",
    ),
    (
        "unknown ONNX parameter",
        'parameters { key: "enable_mem_arena" value: { string_value: "0" } }',
        "parameters.enable_mem_arena",
    ),
    (
        "PyTorch's key on an ONNX model",
        'parameters { key: "torch_compile" value: { string_value: "true" } }',
        "parameters.torch_compile",
    ),
    (
        "unsupported model file name",
        'default_model_filename: "model.plan"',
        "default_model_filename",
    ),
]


@pytest.mark.parametrize(("extra", "path"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_refused_field_fails_the_load_naming_file_and_field(
    tmp_path: Path, extra: str, path: str
) -> None:
    text = LINEAR_CONFIG + extra + "\n"
    message = prepare_error(make_model(tmp_path, text))
    assert message.startswith(f"m/config.pbtxt: {path}"), message


def test_the_error_says_why_and_what_to_do(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + 'ensemble_scheduling { step [ { model_name: "a" } ] }\n'
    message = prepare_error(make_model(tmp_path, text))
    # Honoured for ensembles only: any other backend names who reads it.
    assert "only the ensemble backend reads it; the onnxruntime backend would ignore it" in message
    message = prepare_error(
        make_model(
            tmp_path / "p",
            LINEAR_CONFIG + 'parameters { key: "enable_mem_arena" value: { string_value: "0" } }',
        )
    )
    assert "neither inferd nor the onnxruntime backend reads it" in message
    assert "intra_op_thread_count" in message  # the accepted keys are listed


def test_every_refused_field_is_named_at_once(tmp_path: Path) -> None:
    text = (
        LINEAR_CONFIG
        + "model_operations { op_library_filename: 'x' }\nmetric_tags { key: 'a' value: 'b' }\n"
    )
    message = prepare_error(make_model(tmp_path, text))
    assert message.startswith("m/config.pbtxt: metric_tags: ")  # field order, as the proto
    assert "(also refused: model_operations)" in message


def test_a_refused_scheduler_is_caught_before_completion_replaces_it(tmp_path: Path) -> None:
    # Without inputs the ONNX backend completes the config; a refused sequence_batching field
    # is named before completion touches the scheduler (dynamic_batching shares its oneof).
    text = (
        'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching { iterative_sequence: true }\n"
    )
    message = prepare_error(make_model(tmp_path, text))
    assert message.startswith("m/config.pbtxt: sequence_batching.iterative_sequence")


def test_a_config_given_with_a_load_request_is_checked_too(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, None)
    config = mc.ModelConfig()
    config.name = "m"
    config.platform = "onnxruntime_onnx"
    config.metric_tags["a"] = "b"
    override = parse_config_override("m", json_format.MessageToJson(config))
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: metric_tags: "):
        prepare(model_dir, override)


# -- defaults, and what Triton's own round trip sends back, are accepted ----------------------

ACCEPTED = [
    ("defaults of refused fields", "response_cache { enable: false }\n"
     "model_transaction_policy { decoupled: false }\n"
     "dynamic_batching { preserve_ordering: false }"),
    ("DELAY where no timeout applies",
     "dynamic_batching { default_queue_policy { timeout_action: DELAY } }"),
    ("REJECT with a timeout",
     "dynamic_batching { default_queue_policy { timeout_action: REJECT, "
     "default_timeout_microseconds: 1000 } }"),
    ("the file inferd loads", 'default_model_filename: "model.onnx"'),
    ("ONNX Runtime's keys", 'parameters { key: "execution_mode" value: { string_value: "1" } }'),
    ("inferd's keys", 'parameters { key: "canary_window_s" value: { string_value: "5" } }'),
    ("the served checksum", 'parameters { key: "model_checksum" value: { string_value: "x" } }'),
    ("gpus on a GPU group", "instance_group [ { kind: KIND_GPU, gpus: [ 0 ] } ]"),
]  # fmt: skip


@pytest.mark.parametrize("extra", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(tmp_path: Path, extra: str) -> None:
    prepare(make_model(tmp_path, LINEAR_CONFIG + extra + "\n"))


def test_an_image_format_needs_three_dims(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace("dims: [ 4 ] }", "dims: [ 4 ], format: FORMAT_NCHW }")
    message = prepare_error(make_model(tmp_path, text))
    assert message.startswith("m/config.pbtxt: input.format: format FORMAT_NCHW needs 3 dims")
    image = builders.identity(TensorProto.FLOAT, ["batch", 3, 2, 2])
    text = """
        name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 2
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 3, 2, 2 ], format: FORMAT_NCHW } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 3, 2, 2 ] } ]
    """
    config, _, _, _ = prepare(make_model(tmp_path / "image", text, model=image))
    assert to_json(config)["input"][0]["format"] == "FORMAT_NCHW"  # served to clients


def test_the_served_config_loads_again(tmp_path: Path) -> None:
    """Clients (inferd tune, Triton tooling) read the config and send it back with a load."""
    config, _, _, _ = prepare(make_model(tmp_path, LINEAR_CONFIG + "dynamic_batching { }\n"))
    config.parameters["model_checksum"].string_value = "abc"
    override = parse_config_override("m", json.dumps(to_json(config)))
    again, _, _, _ = prepare(tmp_path / "m", override)
    assert again.max_batch_size == 8


def test_default_model_filename_must_be_the_only_model_file(tmp_path: Path) -> None:
    text = LINEAR_CONFIG.replace("onnxruntime_onnx", "pytorch_libtorch")
    model_dir = make_model(tmp_path, text + 'default_model_filename: "model.pt"\n', model=None)
    (model_dir / "1" / "model.pt").write_bytes(b"")
    (model_dir / "1" / "model.pt2").write_bytes(b"")
    message = prepare_error(model_dir)
    assert "default_model_filename: 'model.pt', but m/1/ holds model.pt, model.pt2" in message


# -- per-backend rules: Python models keep their own parameters -------------------------------

PYTHON_CONFIG = """
    name: "m"
    backend: "python"
    max_batch_size: 8
    input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
    output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


def _python_model(tmp_path: Path, extra: str) -> Path:
    model_dir = make_model(tmp_path, PYTHON_CONFIG + textwrap.dedent(extra), model=None)
    (model_dir / "1" / "model.py").write_text("class Model:\n    pass\n")
    return model_dir


def test_python_models_receive_unknown_parameters(tmp_path: Path) -> None:
    config, _, _, _ = prepare(
        _python_model(tmp_path, 'parameters { key: "greeting" value: { string_value: "hi" } }')
    )
    assert config.parameters["greeting"].string_value == "hi"


def test_an_execution_env_runs_in_a_process_and_not_in_a_thread(tmp_path: Path) -> None:
    env = 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "env.tar.gz" } }'
    _, _, _, spec = prepare(_python_model(tmp_path / "implied", env))
    assert spec.backend.isolation == "process"
    thread = env + 'parameters { key: "isolation" value: { string_value: "thread" } }'
    message = prepare_error(_python_model(tmp_path / "thread", thread))
    assert message.startswith("m/config.pbtxt: parameters: isolation 'thread' cannot run")
    assert "EXECUTION_ENV_PATH" in message


def test_a_backend_specific_field_is_refused_for_other_backends(tmp_path: Path) -> None:
    message = prepare_error(_python_model(tmp_path, "optimization { graph { level: 1 } }"))
    assert message.startswith("m/config.pbtxt: optimization.graph.level: only the onnxruntime")
    prepare(make_model(tmp_path / "onnx", LINEAR_CONFIG + "optimization { graph { level: 1 } }"))
