"""An ensemble's graph as parsed from its config: waves of independent steps, what each step
waits for, the steps an output needs, and the shape rules between producers and consumers."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.pipelines.ensemble_config import GraphError, check_composing, parse_graph
from tests.support.ensemble_models import ensemble_config, step


def _config(text: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(text, config)
    return config


def _op(name: str, max_batch_size: int = 64, dims: str = "-1") -> mc.ModelConfig:
    return _config(
        f'name: "{name}" backend: "python" max_batch_size: {max_batch_size} '
        f'input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ {dims} ] }} ] '
        f'output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ {dims} ] }} ]'
    )


# IN -> a, IN -> b (independent), (a, b) -> OUT; and c from a, which OUT does not need.
DIAMOND = ensemble_config(
    "diamond",
    [
        step("a", {"IN": "IN"}, {"OUT": "ta"}),
        step("b", {"IN": "IN"}, {"OUT": "tb"}),
        step("join", {"A": "ta", "B": "tb"}, {"OUT": "OUT"}),
        step("c", {"IN": "ta"}, {"OUT": "tc"}),
    ],
)


def test_independent_steps_share_a_wave() -> None:
    graph = parse_graph(_config(DIAMOND), "diamond/config.pbtxt")
    assert [[s.model for s in wave] for wave in graph.waves] == [["a", "b"], ["join", "c"]]


def test_each_step_waits_only_for_the_producers_of_what_it_reads() -> None:
    graph = parse_graph(_config(DIAMOND), "diamond/config.pbtxt")
    assert graph.depends_on == {1: set(), 2: set(), 3: {1, 2}, 4: {1}}
    assert not graph.is_chain(frozenset({1, 2, 3}))  # a and b may run at once
    assert graph.is_chain(frozenset({1, 4}))  # a then c: no tasks needed
    assert [s.model for s in graph.in_order(frozenset({1, 4}))] == ["a", "c"]


def test_only_the_steps_an_output_needs_run() -> None:
    graph = parse_graph(_config(DIAMOND), "diamond/config.pbtxt")
    assert graph.needed_steps(["OUT"]) == {1, 2, 3}  # not step 4 (c)


def test_a_step_reading_itself_is_a_cycle() -> None:
    text = ensemble_config(
        "loop",
        [step("a", {"IN": "t"}, {"OUT": "t"}), step("b", {"IN": "IN"}, {"OUT": "OUT"})],
    )
    with pytest.raises(GraphError, match=r"cycle: step 1 \(a\) reads 't' from step 1 \(a\)"):
        parse_graph(_config(text), "loop/config.pbtxt")


def test_variable_dims_match_any_size_and_batch_dims_line_up() -> None:
    text = ensemble_config("e", [step("fixed", {"IN": "IN"}, {"OUT": "OUT"})], in_dims="4")
    graph = parse_graph(_config(text), "e/config.pbtxt")
    # [-1, 4] into [-1, -1], then [-1, -1] out to the ensemble's [-1, -1]: compatible.
    check_composing(graph, _config(text), {1: _op("fixed")})
    # An ensemble that does not batch: its [4] does not line up with a batching [-1, -1].
    text = ensemble_config(
        "e", [step("fixed", {"IN": "IN"}, {"OUT": "OUT"})], max_batch_size=0, in_dims="4"
    )
    graph = parse_graph(_config(text), "e/config.pbtxt")
    with pytest.raises(GraphError, match=r"shape mismatch: input gives FP32 \[4\], step 1"):
        check_composing(graph, _config(text), {1: _op("fixed")})


def test_a_required_input_left_unmapped_is_named() -> None:
    text = ensemble_config("e", [step("join", {"A": "IN"}, {"OUT": "OUT"})])
    join = _config(
        'name: "join" backend: "python" max_batch_size: 64 '
        'input [ { name: "A", data_type: TYPE_FP32, dims: [ -1 ] }, '
        '{ name: "B", data_type: TYPE_FP32, dims: [ -1 ] } ] '
        'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]'
    )
    graph = parse_graph(_config(text), "e/config.pbtxt")
    with pytest.raises(GraphError, match=r"step 1 \(join\): model 'join''s input 'B' is not"):
        check_composing(graph, _config(text), {1: join})


def test_an_ensemble_is_not_its_own_step() -> None:
    text = ensemble_config("e", [step("e", {"IN": "IN"}, {"OUT": "OUT"})])
    with pytest.raises(GraphError, match=r"step 1: an ensemble cannot be its own step"):
        parse_graph(_config(text), "e/config.pbtxt")


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ("model_transaction_policy { decoupled: true }", "is decoupled"),
        ("sequence_batching { }", "is a sequence model"),
    ],
)
def test_steps_that_need_more_than_one_request_are_refused(extra: str, refusal: str) -> None:
    text = ensemble_config("e", [step("m", {"IN": "IN"}, {"OUT": "OUT"})])
    composing = _op("m")
    text_format.Parse(extra, composing)
    graph = parse_graph(_config(text), "e/config.pbtxt")
    with pytest.raises(GraphError, match=rf"step 1 \(m\): model 'm' {refusal}"):
        check_composing(graph, _config(text), {1: composing})
