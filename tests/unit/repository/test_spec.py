"""The typed model spec: every parameter parsed once at load, its defaults, each bad value
failing with an error naming the file, the parameter and the value; and no reader of the
config's parameter strings outside the spec parser."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inferd.config.config_parameters import BACKEND_PARAMETERS, INFERD_PARAMETERS
from inferd.config.input_limits import DEFAULT_MAX_BYTES_ELEMENT_SIZE, DEFAULT_MAX_INPUT_ELEMENTS
from inferd.config.model_config import ConfigError
from inferd.monitoring.capture_settings import CaptureOptions
from inferd.repository.loader import prepare
from inferd.repository.spec import ModelSpec
from inferd.scheduling.queues import QueuePolicy
from tests.support.config_models import LINEAR_CONFIG, make_model
from tests.support.model_specs import spec_of

SRC = Path(__file__).resolve().parents[3] / "src" / "inferd"


def test_defaults() -> None:
    spec = spec_of()
    assert spec.batching.max_batch_size == 8
    assert spec.batching.policy == "work_conserving"
    assert spec.batching.preferred_sizes == ()
    assert spec.batching.queue_policies == (QueuePolicy(),)
    assert spec.limits.max_shape == {}
    assert spec.limits.max_elements == DEFAULT_MAX_INPUT_ELEMENTS
    assert spec.limits.max_bytes_element_size == DEFAULT_MAX_BYTES_ELEMENT_SIZE
    assert not spec.canary.enabled
    assert spec.capture == CaptureOptions(0.0, 1000, "y", 3600.0, None)  # the first output judged
    assert (spec.canary.window_s, spec.canary.min_requests) == (30.0, 20)
    assert (spec.canary.error_rate_margin, spec.canary.p99_ratio) == (0.05, 2.0)
    assert spec.canary_weights is None
    assert not spec.circuit.enabled
    assert (spec.circuit.window_s, spec.circuit.min_requests, spec.circuit.open_s) == (30, 20, 10)
    assert spec.circuit.fallback_model == ""
    assert spec.auto_warmup
    assert spec.unready_after_failures == 5
    assert spec.execution_timeout_ms is None
    assert spec.health_p99_baseline_s is None
    assert spec.instance_count == 1
    assert not spec.decoupled
    assert spec.sequence is None
    backend = spec.backend
    assert backend.intra_op_thread_count is None
    assert backend.intra_op_threads(2) == max(1, (os.cpu_count() or 1) // 2)
    assert (backend.inter_op_thread_count, backend.parallel_execution) == (0, False)
    assert not backend.torch_compile
    assert backend.isolation == "thread"


# (parameters, backend, what the spec reads, the value expected)
PAD = {"pad_inputs": "x"}  # length grouping's keys need it
Q = {"degrade_p99_ms": "100: queue=3"}  # tiers, for the other degrade_* keys to apply to
PARSED: list[tuple[dict[str, str], str, Callable[[ModelSpec], Any], Any]] = [
    ({"batching_policy": "window"}, "onnxruntime", lambda s: s.batching.policy, "window"),
    ({"auto_warmup": "false"}, "onnxruntime", lambda s: s.auto_warmup, False),
    ({"auto_warmup": "No"}, "onnxruntime", lambda s: s.auto_warmup, False),
    ({"auto_warmup": "true"}, "onnxruntime", lambda s: s.auto_warmup, True),
    ({"unready_after_failures": "0"}, "onnxruntime", lambda s: s.unready_after_failures, 0),
    ({"unready_after_failures": "3"}, "onnxruntime", lambda s: s.unready_after_failures, 3),
    ({"execution_timeout_ms": "250"}, "onnxruntime", lambda s: s.execution_timeout_ms, 250),
    ({"execution_timeout_ms": "0"}, "onnxruntime", lambda s: s.execution_timeout_ms, 0),
    ({"max_input_shape": '{"x": [4]}'}, "onnxruntime", lambda s: s.limits.max_shape, {"x": (4,)}),
    ({"max_input_elements": "100"}, "onnxruntime", lambda s: s.limits.max_elements, 100),
    (
        {"max_bytes_element_size": "8"},
        "onnxruntime",
        lambda s: s.limits.max_bytes_element_size,
        8,
    ),
    (
        {"canary_weights": '{"2": 10, "1": 90}'},
        "onnxruntime",
        lambda s: s.canary_weights,
        {"2": 10, "1": 90},
    ),
    ({"canary_auto_rollback": "yes"}, "onnxruntime", lambda s: s.canary.enabled, True),
    ({"canary_auto_rollback": "off"}, "onnxruntime", lambda s: s.canary.enabled, False),
    ({"canary_window_s": "5"}, "onnxruntime", lambda s: s.canary.window_s, 5.0),
    ({"canary_min_requests": "7"}, "onnxruntime", lambda s: s.canary.min_requests, 7),
    ({"canary_error_rate_margin": "0.1"}, "onnxruntime", lambda s: s.canary.error_rate_margin, 0.1),
    ({"canary_p99_ratio": "1.5"}, "onnxruntime", lambda s: s.canary.p99_ratio, 1.5),
    ({"circuit_breaker_failures": "3"}, "onnxruntime", lambda s: s.circuit.failures, 3),
    ({"circuit_breaker_error_rate": "0.5"}, "onnxruntime", lambda s: s.circuit.error_rate, 0.5),
    ({"circuit_breaker_window_s": "2"}, "onnxruntime", lambda s: s.circuit.window_s, 2.0),
    ({"circuit_breaker_min_requests": "4"}, "onnxruntime", lambda s: s.circuit.min_requests, 4),
    ({"circuit_breaker_open_s": "1.5"}, "onnxruntime", lambda s: s.circuit.open_s, 1.5),
    ({"fallback_model": "backup"}, "onnxruntime", lambda s: s.circuit.fallback_model, "backup"),
    ({"health_p99_baseline_ms": "50"}, "onnxruntime", lambda s: s.health_p99_baseline_s, 0.05),
    (
        {"intra_op_thread_count": "3"},
        "onnxruntime",
        lambda s: s.backend.intra_op_threads(4),
        3,
    ),
    ({"inter_op_thread_count": "2"}, "onnxruntime", lambda s: s.backend.inter_op_thread_count, 2),
    ({"execution_mode": "1"}, "onnxruntime", lambda s: s.backend.parallel_execution, True),
    ({"INTRA_OP_THREAD_COUNT": "2"}, "pytorch", lambda s: s.backend.intra_op_thread_count, 2),
    ({"intra_op_thread_count": "5"}, "pytorch", lambda s: s.backend.intra_op_thread_count, 5),
    ({"torch_compile": "true"}, "pytorch", lambda s: s.backend.torch_compile, True),
    ({"isolation": "process"}, "python", lambda s: s.backend.isolation, "process"),
    # its own environment runs in a process of its own (resolved at load: test_execution_env.py)
    ({"EXECUTION_ENV_PATH": "env"}, "python", lambda s: s.backend.isolation, "process"),
    # A Python model's own keys are its own: inferd neither reads nor judges them.
    ({"execution_mode": "fast"}, "python", lambda s: s.backend.parallel_execution, False),
    ({"model_checksum": "abc"}, "onnxruntime", lambda s: s.batching.policy, "work_conserving"),
    ({"text_inputs": " , "}, "python", lambda s: s.text_inputs, frozenset()),
    ({"capture_sample_rate": "0.25"}, "onnxruntime", lambda s: s.capture.sample_rate, 0.25),
    ({"capture_sample_rate": "1"}, "onnxruntime", lambda s: s.capture.sample_rate, 1.0),
    ({"accuracy_window": "50"}, "onnxruntime", lambda s: s.capture.accuracy_window, 50),
    ({"accuracy_output": "y"}, "onnxruntime", lambda s: s.capture.accuracy_output, "y"),
    ({"feedback_ttl_s": "2.5"}, "onnxruntime", lambda s: s.capture.feedback_ttl_s, 2.5),
    ({"canary_accuracy_margin": "0.02"}, "onnxruntime", lambda s: s.capture.accuracy_margin, 0.02),
    ({"drift_reference": "first:500"}, "onnxruntime", lambda s: s.drift.first_rows, 500),
    ({"drift_reference": "none"}, "onnxruntime", lambda s: s.drift.reference, "none"),
    ({"drift_window": "200"}, "onnxruntime", lambda s: s.drift.window, 200),
    ({"drift_sample_rate": "0.25"}, "onnxruntime", lambda s: s.drift.sample_rate, 0.25),
    ({"drift_max_columns": "8"}, "onnxruntime", lambda s: s.drift.max_columns, 8),
    ({"drift_cpu_budget": "0.5"}, "onnxruntime", lambda s: s.drift.cpu_budget, 0.5),
    ({"drift_p_value_threshold": "0.01"}, "onnxruntime", lambda s: s.drift.p_value_threshold, 0.01),
    ({"drift_psi_threshold": "0.3"}, "onnxruntime", lambda s: s.drift.psi_threshold, 0.3),
    ({"drift_class_outputs": "y"}, "onnxruntime", lambda s: s.drift.class_outputs, {"y"}),
    # (with response_cache { enable: true }: test_every_parameter_is_parsed adds it)
    ({"cache_ttl_seconds": "2.5"}, "onnxruntime", lambda s: s.cache.ttl_s, 2.5),
    ({"cache_max_entries": "10"}, "onnxruntime", lambda s: s.cache.max_entries, 10),
    ({"cache_max_response_bytes": "99"}, "onnxruntime", lambda s: s.cache.max_response_bytes, 99),
    ({"cache_float_decimals": "3"}, "onnxruntime", lambda s: s.cache.key.float_decimals, 3),
    ({"degrade_p99_ms": "100: queue=3"}, "python", lambda s: s.degrade.tiers[0].queue_limit, 3),
    ({"degrade_window_s": "4", **Q}, "python", lambda s: s.degrade.window_s, 4.0),
    ({"degrade_min_requests": "7", **Q}, "python", lambda s: s.degrade.min_requests, 7),
    ({"degrade_release_ratio": "0.5", **Q}, "python", lambda s: s.degrade.release_ratio, 0.5),
    ({"degrade_dwell_s": "2", **Q}, "python", lambda s: s.degrade.dwell_s, 2.0),
    (
        {"degrade_probe_interval_ms": "50", **Q},
        "python",
        lambda s: s.degrade.probe_interval_s,
        0.05,
    ),
    (
        {"degrade_p99_ms": "100: stale", "degrade_stale_s": "30", "cache_ttl_seconds": "1"},
        "python",
        lambda s: (s.degrade.stale_s, s.cache.stale_s),
        (30.0, 30.0),
    ),
    (
        {"degrade_p99_ms": "100: rollback", "degrade_rollback_within_s": "60"},
        "python",
        lambda s: s.degrade.rollback_within_s,
        60.0,
    ),
    # pad_inputs and padded_outputs are checked and read into the model's signature
    # (tests/unit/config/test_padding.py); here, that they turn length grouping on.
    (
        {**PAD},
        "onnxruntime",
        lambda s: (s.batching.group_waste, s.batching.group_window),
        (0.25, 32),
    ),
    ({**PAD, "padded_outputs": "y"}, "onnxruntime", lambda s: s.batching.groups_lengths, True),
    ({"pad_grouping_waste": "0.5", **PAD}, "onnxruntime", lambda s: s.batching.group_waste, 0.5),
    ({"pad_grouping_window": "9", **PAD}, "onnxruntime", lambda s: s.batching.group_window, 9),
    (
        {"cache_text_normalize": "lower, strip"},
        "python",
        lambda s: s.cache.key.text_normalize,
        ("strip", "lower"),
    ),
]


def test_text_inputs_name_the_models_string_inputs() -> None:
    strings = 'input [ { name: "a", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
    strings += 'input [ { name: "b", data_type: TYPE_STRING, dims: [ 1 ] } ]'
    spec = spec_of({"text_inputs": "a, b"}, "python", strings)
    assert spec.text_inputs == frozenset({"a", "b"})
    assert spec_of(backend="python", extra=strings).text_inputs == frozenset()


@pytest.mark.parametrize(("parameters", "backend", "read", "expected"), PARSED)
def test_every_parameter_is_parsed(
    parameters: dict[str, str], backend: str, read: Callable[[ModelSpec], Any], expected: Any
) -> None:
    cached = any(k.startswith("cache_") for k in parameters)
    extra = "response_cache { enable: true }" if cached else ""
    assert read(spec_of(parameters, backend, extra)) == expected


def test_the_table_covers_every_parameter_inferd_reads() -> None:
    covered = {key for parameters, *_ in PARSED for key in parameters}
    listed = {*INFERD_PARAMETERS, *(k for keys in BACKEND_PARAMETERS.values() for k in keys)}
    assert listed - covered == set()


def test_config_fields_are_parsed_too() -> None:
    spec = spec_of(
        extra="""
            instance_group [ { count: 2 }, { count: 3 } ]
            model_transaction_policy { decoupled: true }
            dynamic_batching {
              preferred_batch_size: [ 4, 8 ]
              max_queue_delay_microseconds: 500
              priority_levels: 2
              default_priority_level: 2
              default_queue_policy { max_queue_size: 3 timeout_action: DELAY }
              priority_queue_policy { key: 1 value: { max_queue_size: 9 } }
            }
        """
    )
    assert spec.instance_count == 5
    assert spec.decoupled
    assert spec.batching.preferred_sizes == (4, 8)
    assert spec.batching.max_delay_s == 500e-6
    assert spec.batching.default_priority == 1
    assert [p.max_queue_size for p in spec.batching.queue_policies] == [9, 3]
    assert spec.batching.queue_policies[1].reject_on_timeout is False


def test_execution_timeout_defaults_to_the_servers_except_for_decoupled_models() -> None:
    assert spec_of().execution_timeout_s(2000) == 2.0
    decoupled = spec_of(extra="model_transaction_policy { decoupled: true }")
    assert decoupled.execution_timeout_s(2000) == 0.0
    assert spec_of({"execution_timeout_ms": "300"}).execution_timeout_s(2000) == 0.3


def test_a_sequence_model_has_its_sequence_options() -> None:
    spec = spec_of(extra="sequence_batching { max_sequence_idle_microseconds: 5000000 }")
    assert spec.sequence is not None


# (parameters, backend, words the error names beside the file)
BAD: list[tuple[dict[str, str], str, list[str]]] = [
    ({"batching_policy": "eager"}, "onnxruntime", ["parameters.batching_policy", "'eager'"]),
    ({"text_inputs": "x"}, "python", ["text_inputs", "'x'", "TYPE_STRING"]),
    ({"text_inputs": "nope"}, "python", ["text_inputs", "'nope'", "TYPE_STRING"]),
    ({"unready_after_failures": "-1"}, "onnxruntime", ["unready_after_failures", "'-1'"]),
    ({"unready_after_failures": "x"}, "onnxruntime", ["unready_after_failures", "'x'"]),
    ({"execution_timeout_ms": "soon"}, "onnxruntime", ["execution_timeout_ms", "'soon'"]),
    ({"execution_timeout_ms": "-5"}, "onnxruntime", ["execution_timeout_ms", "-5"]),
    ({"max_input_shape": "[4]"}, "onnxruntime", ["max_input_shape", "JSON object"]),
    ({"max_input_shape": '{"z": [4]}'}, "onnxruntime", ["max_input_shape", "'z'"]),
    ({"max_input_elements": "lots"}, "onnxruntime", ["max_input_elements", "'lots'"]),
    ({"max_input_elements": "0"}, "onnxruntime", ["max_input_elements", "0"]),
    ({"max_bytes_element_size": "1.5"}, "onnxruntime", ["max_bytes_element_size", "'1.5'"]),
    ({"canary_weights": "{"}, "onnxruntime", ["parameters.canary_weights", "JSON"]),
    ({"canary_weights": '{"2": -1}'}, "onnxruntime", ["parameters.canary_weights", "2"]),
    ({"canary_window_s": "long"}, "onnxruntime", ["canary_*", "'long'"]),
    ({"canary_min_requests": "1.5"}, "onnxruntime", ["canary_*", "'1.5'"]),
    ({"circuit_breaker_failures": "many"}, "onnxruntime", ["circuit_breaker_*", "'many'"]),
    ({"circuit_breaker_error_rate": "2"}, "onnxruntime", ["circuit_breaker_error_rate"]),
    ({"fallback_model": "m"}, "onnxruntime", ["fallback_model", "the model itself"]),
    ({"health_p99_baseline_ms": "fast"}, "onnxruntime", ["health_p99_baseline_ms", "'fast'"]),
    ({"health_p99_baseline_ms": "0"}, "onnxruntime", ["health_p99_baseline_ms", "'0'"]),
    ({"intra_op_thread_count": "many"}, "onnxruntime", ["intra_op_thread_count", "'many'"]),
    ({"inter_op_thread_count": "two"}, "onnxruntime", ["inter_op_thread_count", "'two'"]),
    ({"execution_mode": "5"}, "onnxruntime", ["parameters.execution_mode", "5"]),
    ({"INTRA_OP_THREAD_COUNT": "all"}, "pytorch", ["INTRA_OP_THREAD_COUNT", "'all'"]),
    ({"isolation": "fork"}, "python", ["isolation", "'fork'"]),
    ({"capture_sample_rate": "1.5"}, "onnxruntime", ["parameters.capture_sample_rate", "'1.5'"]),
    ({"capture_sample_rate": "-0.1"}, "onnxruntime", ["parameters.capture_sample_rate", "0..1"]),
    ({"capture_sample_rate": "often"}, "onnxruntime", ["capture_sample_rate", "'often'"]),
    ({"accuracy_window": "0"}, "onnxruntime", ["parameters.accuracy_window", "0"]),
    ({"accuracy_window": "big"}, "onnxruntime", ["parameters.accuracy_window", "'big'"]),
    ({"accuracy_output": "z"}, "onnxruntime", ["parameters.accuracy_output", "'z'", "y"]),
    ({"feedback_ttl_s": "0"}, "onnxruntime", ["parameters.feedback_ttl_s", "'0'"]),
    ({"feedback_ttl_s": "inf"}, "onnxruntime", ["parameters.feedback_ttl_s", "'inf'"]),
    ({"canary_accuracy_margin": "2"}, "onnxruntime", ["parameters.canary_accuracy_margin", "'2'"]),
    ({"canary_accuracy_margin": "x"}, "onnxruntime", ["canary_accuracy_margin", "'x'"]),
    ({"drift_reference": "first:x"}, "onnxruntime", ["parameters.drift_reference", "'first:x'"]),
    ({"drift_reference": "last:5"}, "onnxruntime", ["parameters.drift_reference", "'last:5'"]),
    ({"drift_window": "5"}, "onnxruntime", ["parameters.drift_window", "'5'"]),
    ({"drift_window": "1.5"}, "onnxruntime", ["parameters.drift_window", "integer"]),
    ({"drift_sample_rate": "2"}, "onnxruntime", ["parameters.drift_sample_rate", "0..1"]),
    ({"drift_max_columns": "0"}, "onnxruntime", ["parameters.drift_max_columns", "'0'"]),
    ({"drift_cpu_budget": "none"}, "onnxruntime", ["parameters.drift_cpu_budget", "'none'"]),
    ({"drift_p_value_threshold": "nan"}, "onnxruntime", ["drift_p_value_threshold", "'nan'"]),
    ({"drift_psi_threshold": "-1"}, "onnxruntime", ["parameters.drift_psi_threshold", "'-1'"]),
    ({"drift_class_outputs": "z"}, "onnxruntime", ["drift_class_outputs", "'z'", "output"]),
]


@pytest.mark.parametrize(("parameters", "backend", "words"), BAD)
def test_each_bad_value_names_file_parameter_and_value(
    parameters: dict[str, str], backend: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        spec_of(parameters, backend)
    message = str(caught.value)
    assert message.startswith("m/config.pbtxt: ")
    for word in words:
        assert word in message


def test_a_bad_value_fails_the_load(tmp_path: Path) -> None:
    text = LINEAR_CONFIG + 'parameters { key: "canary_window_s" value: { string_value: "x" } }\n'
    with pytest.raises(ConfigError, match=r"^m/config\.pbtxt: parameters: a canary_\* value"):
        prepare(make_model(tmp_path, text))
    *_, spec = prepare(make_model(tmp_path / "ok", LINEAR_CONFIG))
    assert spec.batching.max_batch_size == 8


# -- nothing outside the spec parser reads parameter strings ----------------------------------

SPEC_MODULES = {
    "repository/spec.py",
    "config/backend_parameters.py",
    "config/input_limits.py",
    "config/padding_config.py",
    "monitoring/drift_spec.py",
    "cache/model_cache_spec.py",
    "reliability/degrade/tier_spec.py",
}
READERS = {"parameter", "int_parameter"}


def _parameter_reads(tree: ast.AST) -> list[int]:
    """Lines that call a parameter reader or read `<...>config.parameters[...].string_value`."""
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).rsplit(".", 1)[-1]
            if name in READERS:
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "string_value"
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Subscript)
            and ast.unparse(node.value.value).endswith("config.parameters")
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_spec_parser_reads_parameter_strings() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative in SPEC_MODULES or relative == "config/model_config.py":  # definitions
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{relative}:{line}" for line in _parameter_reads(tree)]
    assert found == [], "read the ModelSpec's fields instead (inferd.repository.spec)"


def test_the_readers_finder_sees_a_read() -> None:
    tree = ast.parse('parameter(config, "k")\nx = mv.config.parameters["k"].string_value\n')
    assert _parameter_reads(tree) == [1, 2]
