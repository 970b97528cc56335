"""`ModelSignature.bind`: a request's tensors checked against the model's declared ones."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.errors import ErrorKind, InferdError
from inferd.tensors.signature import ModelSignature
from inferd.types import InferRequest, RequestedOutput, Tensor

BATCHED = """
    name: "m"
    max_batch_size: 4
    input [
      { name: "A", data_type: TYPE_FP32, dims: [ 3 ] },
      { name: "B", data_type: TYPE_INT32, dims: [ -1 ] }
    ]
    output [
      { name: "X", data_type: TYPE_FP32, dims: [ 3 ] },
      { name: "Y", data_type: TYPE_INT64, dims: [ 1 ] }
    ]
"""


def signature(text: str = BATCHED) -> ModelSignature:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(text), config)
    return ModelSignature(config)


def tensor(name: str, datatype: str, shape: tuple[int, ...]) -> Tensor:
    dtype = {"FP32": np.float32, "INT32": np.int32, "BYTES": np.object_}[datatype]
    data = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)  # type: ignore[var-annotated]
    return Tensor(name, datatype, shape, data)


def request(*tensors: Tensor, outputs: list[RequestedOutput] | None = None) -> InferRequest:
    return InferRequest("m", "", list(tensors), outputs=outputs)


def bind_error(req: InferRequest, sig: ModelSignature | None = None) -> str:
    with pytest.raises(InferdError) as info:
        (sig or signature()).bind(req)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    return info.value.message


def good_a(rows: int = 2) -> Tensor:
    return tensor("A", "FP32", (rows, 3))


def good_b(rows: int = 2, width: int = 5) -> Tensor:
    return tensor("B", "INT32", (rows, width))


# -- success ----------------------------------------------------------------------------------


def test_bind_success() -> None:
    bound = signature().bind(request(good_b(), good_a()))
    assert list(bound.inputs) == ["A", "B"]  # the model's declared order
    assert bound.rows == 2
    assert bound.shape_key == ((3,), (5,))
    assert bound.output_names == ["X", "Y"]
    assert bound.inputs["A"].shape == (2, 3)


def test_bind_requested_outputs() -> None:
    bound = signature().bind(request(good_a(), good_b(), outputs=[RequestedOutput("Y")]))
    assert bound.output_names == ["Y"]


def test_bind_empty_requested_outputs_means_all() -> None:
    bound = signature().bind(request(good_a(), good_b(), outputs=[]))
    assert bound.output_names == ["X", "Y"]


def test_shape_key_separates_variable_dims() -> None:
    sig = signature()
    one = sig.bind(request(good_a(1), good_b(1, width=5)))
    two = sig.bind(request(good_a(3), good_b(3, width=5)))
    other = sig.bind(request(good_a(1), good_b(1, width=6)))
    assert one.shape_key == two.shape_key
    assert one.shape_key != other.shape_key


def test_bind_with_reshape() -> None:
    sig = signature("""
        name: "m"
        max_batch_size: 8
        input [ { name: "R", data_type: TYPE_FP32, dims: [ 6 ], reshape: { shape: [ 2, 3 ] } } ]
        output [ { name: "O", data_type: TYPE_FP32, dims: [ 1 ] } ]
    """)
    t = tensor("R", "FP32", (2, 6))
    bound = sig.bind(request(t))
    assert bound.rows == 2
    assert bound.inputs["R"].shape == (2, 2, 3)
    assert bound.shape_key == ((2, 3),)
    assert bound.inputs["R"].reshape(-1).tolist() == t.data.reshape(-1).tolist()


def test_bind_with_reshape_unbatched() -> None:
    sig = signature("""
        name: "m"
        input [ { name: "R", data_type: TYPE_FP32, dims: [ 1, 4 ], reshape: { shape: [ 4 ] } } ]
        output [ { name: "O", data_type: TYPE_FP32, dims: [ 1 ] } ]
    """)
    bound = sig.bind(request(tensor("R", "FP32", (1, 4))))
    assert bound.rows == 1
    assert bound.inputs["R"].shape == (4,)


def test_bind_with_variable_reshape() -> None:
    sig = signature("""
        name: "m"
        max_batch_size: 8
        input [ { name: "R", data_type: TYPE_FP32, dims: [ -1 ], reshape: { shape: [ -1, 2 ] } } ]
        output [ { name: "O", data_type: TYPE_FP32, dims: [ 1 ] } ]
    """)
    bound = sig.bind(request(tensor("R", "FP32", (1, 4))))
    assert bound.inputs["R"].shape == (1, 2, 2)


def test_variable_reshape_that_does_not_fit_is_invalid_argument() -> None:
    """dims [-1] -> reshape [-1, 2]: 3 elements per row cannot be reshaped; the client's fault."""
    sig = signature("""
        name: "m"
        max_batch_size: 8
        input [ { name: "R", data_type: TYPE_FP32, dims: [ -1 ], reshape: { shape: [ -1, 2 ] } } ]
        output [ { name: "O", data_type: TYPE_FP32, dims: [ 1 ] } ]
    """)
    assert "input 'R'" in bind_error(request(tensor("R", "FP32", (1, 3))), sig)


def test_unbatched_model() -> None:
    sig = signature("""
        name: "m"
        input [ { name: "A", data_type: TYPE_FP32, dims: [ 2, 3 ] } ]
        output [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]
    """)
    bound = sig.bind(request(tensor("A", "FP32", (2, 3))))
    assert bound.rows == 1
    assert bound.shape_key == ((3,),)
    message = bind_error(request(tensor("A", "FP32", (1, 2, 3))), sig)
    assert "input 'A'" in message
    assert "[2, 3]" in message


def test_optional_input_may_be_left_out() -> None:
    sig = signature("""
        name: "m"
        max_batch_size: 2
        input [
          { name: "A", data_type: TYPE_FP32, dims: [ 3 ] },
          { name: "B", data_type: TYPE_INT32, dims: [ 1 ], optional: true }
        ]
        output [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]
    """)
    bound = sig.bind(request(good_a(1)))
    assert list(bound.inputs) == ["A"]


# -- errors -----------------------------------------------------------------------------------


def test_unexpected_input() -> None:
    message = bind_error(request(good_a(), good_b(), tensor("C", "FP32", (2, 1))))
    assert "unexpected input 'C'" in message
    assert "A, B" in message


def test_duplicate_input() -> None:
    message = bind_error(request(good_a(), good_b(), good_a()))
    assert "input 'A'" in message
    assert "more than once" in message


def test_datatype_mismatch() -> None:
    message = bind_error(request(tensor("A", "INT32", (2, 3)), good_b()))
    assert "input 'A'" in message
    assert "INT32" in message
    assert "FP32" in message


@pytest.mark.parametrize("rows", [0, 5])
def test_batch_size_out_of_range(rows: int) -> None:
    message = bind_error(request(good_a(rows), good_b(rows)))
    assert "input 'A'" in message
    assert f"batch size {rows}" in message
    assert "1..4" in message


def test_scalar_input_to_batched_model() -> None:
    message = bind_error(request(tensor("A", "FP32", ()), good_b()))
    assert "input 'A'" in message
    assert "no batch dimension" in message


def test_batch_sizes_differ_between_inputs() -> None:
    message = bind_error(request(good_a(2), good_b(3)))
    assert "input 'B'" in message
    assert "batch size 3" in message
    assert "2" in message


@pytest.mark.parametrize("shape", [(2, 4), (2, 3, 1), (2,)])
def test_shape_mismatch(shape: tuple[int, ...]) -> None:
    message = bind_error(request(tensor("A", "FP32", shape), good_b()))
    assert "input 'A'" in message
    assert f"shape {list(shape)}" in message
    assert "[-1, 3]" in message


def test_missing_input() -> None:
    message = bind_error(request(good_a()))
    assert "missing input 'B'" in message


def test_unknown_requested_output() -> None:
    message = bind_error(request(good_a(), good_b(), outputs=[RequestedOutput("Z")]))
    assert "unknown output 'Z'" in message
    assert "X, Y" in message


def test_a_fixed_shape_input_keeps_the_element_limit_it_can_reach() -> None:
    """A fixed-shape input is checked against max_input_elements only when a request can
    pass it (max_batch_size x its elements): here 4 x 3 > 9, so 3 rows pass and 4 do not;
    the variable-width input B is checked on every request."""
    limited = BATCHED + 'parameters { key: "max_input_elements" value: { string_value: "9" } }\n'
    sig = signature(limited)
    assert sig._limited == {"A", "B"}
    sig.bind(request(good_a(3), good_b(3, 3)))
    message = bind_error(request(good_a(4), good_b(4, 2)), sig)
    assert "input 'A'" in message and "max_input_elements" in message
    assert signature()._limited == {"B"}  # 4 x 3 within the default limit: never checked
