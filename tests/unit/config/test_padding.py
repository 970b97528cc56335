"""Padding to the batch's longest member without a server: the config's checks, the shape
key and length of a request, the merge that pads and the split that cuts back."""

from __future__ import annotations

import asyncio
import textwrap

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError
from inferd.config.padding_config import PadInput, read_padding_plan
from inferd.config.ragged_config import read_ragged_plan
from inferd.errors import InferdError
from inferd.repository.spec import batching_options
from inferd.scheduling.merge import merged_inputs, padded, padding_counts
from inferd.scheduling.pending import Pending
from inferd.scheduling.run_batch import ContractError, run_batch
from inferd.tensors.signature import BoundRequest, ModelSignature
from inferd.types import Array, InferRequest, Tensor

TOKENS = """
    name: "m"
    max_batch_size: 8
    input [
      { name: "ids", data_type: TYPE_INT64, dims: [ -1 ] },
      { name: "mask", data_type: TYPE_INT64, dims: [ -1 ] },
      { name: "scale", data_type: TYPE_FP32, dims: [ 1 ] }
    ]
    output [
      { name: "hidden", data_type: TYPE_FP32, dims: [ -1, 2 ] },
      { name: "pooled", data_type: TYPE_FP32, dims: [ 2 ] }
    ]
    parameters { key: "pad_inputs" value { string_value: "ids:7, mask" } }
    parameters { key: "padded_outputs" value { string_value: "hidden" } }
"""


def parse(text: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(text), config)
    return config


def request(
    sig: ModelSignature, length: int, rows: int = 1, mask: int | None = None
) -> BoundRequest:
    ids = np.arange(1, rows * length + 1, dtype=np.int64).reshape(rows, length)
    m = np.ones((rows, length if mask is None else mask), np.int64)
    tensors = [
        Tensor("ids", "INT64", ids.shape, ids),
        Tensor("mask", "INT64", m.shape, m),
        Tensor("scale", "FP32", (rows, 1), np.ones((rows, 1), np.float32)),
    ]
    return sig.bind(InferRequest("m", "", tensors))


def test_the_plan_reads_inputs_values_and_outputs() -> None:
    plan = read_padding_plan(parse(TOKENS))
    assert plan is not None
    assert plan.inputs == (PadInput("ids", 1, 7), PadInput("mask", 1, 0))
    assert plan.outputs == {"hidden": 1}
    assert read_ragged_plan(parse(TOKENS)).active


def test_requests_of_any_length_share_a_key_and_carry_their_length() -> None:
    sig = ModelSignature(parse(TOKENS))
    short, long = request(sig, 3), request(sig, 9)
    assert short.shape_key == long.shape_key
    assert (short.length, long.length) == (3, 9)


def test_padded_inputs_of_one_request_must_agree_in_length() -> None:
    sig = ModelSignature(parse(TOKENS))
    with pytest.raises(InferdError) as info:
        request(sig, 3, mask=4)
    assert "input 'mask' holds 4 in its padded dimension and input 'ids' 3" in str(info.value)
    assert "pad_inputs" in str(info.value)


def test_the_merge_pads_each_input_to_the_longest_with_its_value() -> None:
    sig = ModelSignature(parse(TOKENS))
    requests = [request(sig, 2), request(sig, 4, rows=2), request(sig, 1)]
    inputs = merged_inputs(requests, sig.ragged)
    assert inputs["ids"].tolist() == [
        [1, 2, 7, 7],
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [1, 7, 7, 7],
    ]
    assert inputs["mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert inputs["scale"].shape == (4, 1)
    assert padding_counts(requests, sig.ragged.padding) == (2 * (2 + 8 + 1), 2 * 4 * 4)  # type: ignore[arg-type]


def test_equal_lengths_are_concatenated_and_a_lone_request_is_not_copied() -> None:
    sig = ModelSignature(parse(TOKENS))
    lone = request(sig, 3)
    assert merged_inputs([lone], sig.ragged)["ids"] is lone.inputs["ids"]
    pad = PadInput("x", 1, 0)
    same = padded([np.ones((1, 3)), np.zeros((2, 3))], pad)
    assert same.shape == (3, 3) and same.sum() == 3


def test_padding_works_along_an_inner_axis() -> None:
    pad = PadInput("x", 2, -1)
    out = padded([np.zeros((1, 2, 1), np.int32), np.zeros((1, 2, 3), np.int32)], pad)
    assert out.shape == (2, 2, 3)
    assert out[0].tolist() == [[0, -1, -1], [0, -1, -1]]


class Echo:
    """An instance whose `hidden` carries the padded dimension (the model's view of ids)."""

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        ids = inputs["ids"]
        hidden = np.repeat(ids[:, :, None].astype(np.float32), 2, axis=2)
        return {"hidden": hidden, "pooled": hidden.sum(axis=1)}


def pending(requests: list[BoundRequest]) -> list[Pending]:
    loop = asyncio.new_event_loop()
    try:
        return [Pending(r, loop.create_future()) for r in requests]
    finally:
        loop.close()


def test_the_split_cuts_padded_outputs_back_to_each_requests_length() -> None:
    sig = ModelSignature(parse(TOKENS))
    batch = pending([request(sig, 2), request(sig, 4), request(sig, 1)])
    results, _ = run_batch(Echo(), batch, True, False, ragged=sig.ragged)  # type: ignore[arg-type]
    hidden = [r["hidden"] for r in results]  # type: ignore[index]
    assert [h.shape for h in hidden] == [(1, 2, 2), (1, 4, 2), (1, 1, 2)]
    assert hidden[0][0, :, 0].tolist() == [1, 2]
    # `pooled` is not cut: the model pooled over the padded batch (its pad value 7 shows).
    assert results[0]["pooled"].tolist() == [[1 + 2 + 7 + 7] * 2]  # type: ignore[index]


class Short(Echo):
    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        out = super().execute(inputs)
        out["hidden"] = out["hidden"][:, :1]
        return out


def test_an_output_without_the_padded_length_breaks_the_contract() -> None:
    sig = ModelSignature(parse(TOKENS))
    batch = pending([request(sig, 2), request(sig, 4)])
    with pytest.raises(ContractError, match="output 'hidden' holds 1 in dimension 1"):
        run_batch(Short(), batch, True, False, ragged=sig.ragged)  # type: ignore[arg-type]


def test_length_grouping_is_on_by_default_and_can_be_set() -> None:
    options = batching_options(parse(TOKENS))
    assert (options.group_waste, options.group_window, options.groups_lengths) == (0.25, 32, True)
    tuned = (
        TOKENS
        + """
        parameters { key: "pad_grouping_waste" value { string_value: "0.5" } }
        parameters { key: "pad_grouping_window" value { string_value: "10" } }
    """
    )
    assert (
        batching_options(parse(tuned)).group_waste,
        batching_options(parse(tuned)).group_window,
    ) == (0.5, 10)
    off = TOKENS + 'parameters { key: "pad_grouping_waste" value { string_value: "off" } }'
    assert not batching_options(parse(off)).groups_lengths
    assert not batching_options(parse(TOKENS.replace("pad_inputs", "x"))).groups_lengths


def with_parameters(text: str, **parameters: str) -> str:
    for key, value in parameters.items():
        text = (
            text.replace(f'parameters {{ key: "{key}"', f'parameters {{ key: "_{key}"')
            + f'\nparameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
        )
    return text


BAD = [
    (
        "unknown input",
        {"pad_inputs": "nope"},
        "",
        "pad_inputs: 'nope' is not an input of the model",
    ),
    ("twice", {"pad_inputs": "ids, ids"}, "", "'ids' is named twice"),
    ("fixed dims", {"pad_inputs": "scale"}, "", "needs exactly one variable dimension (-1)"),
    (
        "integer value",
        {"pad_inputs": "ids:0.5"},
        "",
        "pad value of 'ids' (TYPE_INT64) must be an integer",
    ),
    (
        "outputs alone",
        {"pad_inputs": "", "padded_outputs": "hidden"},
        "",
        "padded_outputs: needs pad_inputs",
    ),
    ("unknown output", {"padded_outputs": "nope"}, "", "padded_outputs: 'nope' is not an output"),
    (
        "fixed output",
        {"padded_outputs": "pooled"},
        "",
        "output 'pooled': needs exactly one variable",
    ),
    ("sequence", {}, "sequence_batching { }", "not supported with sequence_batching"),
    ("no batching", {}, "", "needs max_batch_size > 0"),
    ("ensemble", {}, 'platform: "ensemble"', "an ensemble executes no batch of its own"),
    ("waste", {"pad_grouping_waste": "-1"}, "", "pad_grouping_waste: must be a number >= 0"),
    ("window", {"pad_grouping_window": "0"}, "", "pad_grouping_window: must be >= 1"),
    (
        "grouping alone",
        {"pad_inputs": "", "padded_outputs": "", "pad_grouping_waste": "0.1"},
        "",
        "pad_grouping_waste: needs pad_inputs",
    ),
    (
        "preferred",
        {},
        "dynamic_batching { preferred_batch_size: [ 4 ] }",
        "preferred_batch_size: not used",
    ),
]


@pytest.mark.parametrize(
    ("parameters", "extra", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_a_bad_padding_config_fails_naming_the_field(
    parameters: dict[str, str], extra: str, words: str
) -> None:
    text = with_parameters(TOKENS, **parameters) + extra
    if words == "needs max_batch_size > 0":
        text = text.replace("max_batch_size: 8", "max_batch_size: 0")
    config = parse(text)
    with pytest.raises(ConfigError) as info:
        read_ragged_plan(config)
        batching_options(config)
    message = str(info.value)
    assert message.startswith("m/config.pbtxt: "), message
    assert words in message, message
