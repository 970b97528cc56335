"""A model's declared inputs and outputs, and the check of one request against them.

Everything a request can get wrong about tensors is caught here, at the edge, with a message
that names the input and what was expected: nothing malformed reaches the batcher or a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.input_limits import InputLimits, read_limits
from inferd.config.ragged_config import read_ragged_plan
from inferd.datatypes import CONFIG_TO_V2
from inferd.errors import invalid
from inferd.tensors.request_parameters import model_parameters
from inferd.tensors.text_inputs import check_utf8
from inferd.types import Array, InferRequest, Parameters, RequestedOutput

if TYPE_CHECKING:
    from inferd.events import CallContext
    from inferd.streams import ResponseSink


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 is any size
    reshape: tuple[int, ...] | None  # the shape the model itself sees / produces
    optional: bool = False

    def matches(self, shape: Sequence[int]) -> bool:
        if -1 not in self.dims:  # fixed dims: one tuple comparison (on every request)
            return tuple(shape) == self.dims
        if len(shape) != len(self.dims):
            return False
        for d, s in zip(self.dims, shape, strict=True):  # noqa: SIM110 (no generator per request)
            if d != -1 and d != s:
                return False
        return True


@dataclass(slots=True)
class BoundRequest:
    """A request whose inputs passed the signature check, ready for the scheduler."""

    inputs: dict[str, Array]  # in the model's declared input order, reshaped for the model
    rows: int  # batch size of this request; 1 for unbatched models
    # Non-batch shapes of the inputs that are not ragged: only equal keys may be merged.
    shape_key: tuple[tuple[int, ...], ...]
    output_names: list[str]
    request_id: str = ""  # the client's request id, "" when it sent none
    # For models that read them (ModelSignature.model_parameters: Python models): the
    # request's parameters without Triton's reserved keys, and its `timeout` (µs; 0: none).
    parameters: Parameters = field(default_factory=dict)
    timeout_us: int = 0
    # Sequence models: the request's sequence id (0 / "": none) and its SEQUENCE_START (1) /
    # SEQUENCE_END (2) flags, set by the data plane from the request parameters.
    correlation_id: int | str = 0
    flags: int = 0
    # Models with `pad_inputs`: the size of its padded dimension (the batch pads to the
    # longest; outputs in `padded_outputs` are cut back to it); 0 for other models.
    length: int = 0
    # Its inputs are views of memory reused once it is answered (a shared-memory region, the
    # engine hop's slab): whoever keeps them past the answer copies them first (drift).
    borrowed: bool = False
    responses: ResponseSink | None = None  # a decoupled model's response stream for it
    # Output name -> k: outputs the client asked for as their top k classes (set by the
    # data plane from the requested outputs' `classification` parameters); None: none.
    classes: dict[str, int] | None = None
    # Set while a Triton Python model executes it: whether the client gave up on it.
    is_cancelled: Callable[[], bool] | None = None
    # What a Triton Python model attached to its response (InferenceResponse(parameters=)).
    response_parameters: dict[str, Any] | None = None
    # Where it came from (set by the data plane): the deadline and trace context a call the
    # model makes meanwhile to another model (BLS) carries on; None for warm-up samples.
    ctx: CallContext | None = None


def _dims(spec_dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in spec_dims)


class ModelSignature:
    def __init__(self, config: mc.ModelConfig, limits: InputLimits | None = None) -> None:
        """`limits`: the model spec's (parsed at load); read from `config` when not given.
        Raises `ConfigError` when the config's input limits or ragged inputs are malformed."""
        self.limits = read_limits(config) if limits is None else limits
        self.ragged = read_ragged_plan(config)
        # Inputs the server feeds the model itself (sequence control inputs, implicit state,
        # batch inputs): name -> what it is, for the error a client sending one gets.
        self.server_inputs: dict[str, str] = self.ragged.targets()
        # Inputs whose shapes key a batch: all but the ragged and padded ones (None: all).
        padding = self.ragged.padding
        self._padded = padding.inputs if padding is not None else ()
        unkeyed = self.ragged.ragged | {p.name for p in self._padded}
        self._keyed: tuple[str, ...] | None = (
            tuple(i.name for i in config.input if i.name not in unkeyed) if unkeyed else None
        )
        self.config_file = f"{config.name}/config.pbtxt"  # named in every mismatch message
        # Request parameters reach the model (the Python backend): checked and handed over.
        self.model_parameters = False
        # Output name -> its classification labels (label_filename), set when it loads.
        self.labels: dict[str, tuple[str, ...]] = {}
        self.max_batch_size = int(config.max_batch_size)
        self.is_batched = self.max_batch_size > 0  # read on every request: not a property
        self.inputs = {
            i.name: TensorSpec(
                i.name,
                CONFIG_TO_V2[i.data_type],
                _dims(i.dims),
                _dims(i.reshape.shape) if i.HasField("reshape") else None,
                bool(i.optional),
            )
            for i in config.input
        }
        # BYTES inputs the model (the config's `text_inputs`, from its spec) or its backend
        # (ONNX Runtime string tensors) decodes as UTF-8: the registry sets them at load;
        # other bytes are refused before batching.
        self.text_inputs: frozenset[str] = frozenset()
        self._optional = tuple(n for n, spec in self.inputs.items() if spec.optional)
        self.outputs = {
            o.name: TensorSpec(
                o.name,
                CONFIG_TO_V2[o.data_type],
                _dims(o.dims),
                _dims(o.reshape.shape) if o.HasField("reshape") else None,
            )
            for o in config.output
        }
        # The inputs a request can take past the config's limits. A fixed-shape input of
        # numbers without a max_input_shape of its own holds at most max_batch_size times its
        # elements (its shape is checked first): within the limit or not, found here once.
        most = max(self.max_batch_size, 1)
        self._limited = frozenset(
            name
            for name, spec in self.inputs.items()
            if spec.datatype == "BYTES"
            or -1 in spec.dims
            or name in self.limits.max_shape
            or math.prod(spec.dims) * most > self.limits.max_elements
        )

    def metadata_shape(self, spec: TensorSpec) -> list[int]:
        """The shape a client sends or receives: a leading -1 when the model batches."""
        return ([-1] if self.is_batched else []) + list(spec.dims)

    def bind(self, request: InferRequest, checked: bool = False) -> BoundRequest:
        """`request` checked and bound. `checked`: a front end of `--engine` ran this very
        check on this request against this signature (engine/model_table.py says when that
        holds), so only the binding is left to do."""
        model = request.model_name
        given, rows = self._given_checked(request) if checked else self._given(request)
        inputs = self._declared(given, model)
        keyed = self._keyed
        shape_key = (  # lists, not generators: a generator's every step is a call
            tuple([a.shape[1:] for a in inputs.values()])
            if keyed is None
            else tuple([inputs[n].shape[1:] for n in keyed if n in inputs])
        )
        if self._optional:
            # Which optional inputs it sends keys the batch too: requests sending different
            # ones cannot be merged (two sending one each, of the same shape, failed with
            # KeyError in the merge, and 49 of 50 valid requests with it).
            shape_key += (tuple(int(n in inputs) for n in self._optional),)
        length = self._length(inputs, model) if self._padded else 0
        bound = BoundRequest(
            inputs=inputs,
            rows=rows if self.is_batched else 1,
            shape_key=shape_key,
            output_names=self._output_names(request.outputs, model),
            request_id=request.id,
            length=length,
            borrowed=request.uses_shared_memory or request.inputs_borrowed,
        )
        if request.parameters and self.model_parameters:
            bound.parameters, bound.timeout_us = model_parameters(request.parameters)
        return bound

    def check(self, request: InferRequest) -> None:
        """Refuse what `bind` refuses, with its errors in its order, binding nothing: what a
        front end of `--engine` runs before the hop (engine/model_table.py)."""
        model = request.model_name
        inputs = self._declared(self._given(request)[0], model)
        if self._padded:
            self._length(inputs, model)
        self._output_names(request.outputs, model)
        if request.parameters and self.model_parameters:
            model_parameters(request.parameters)

    def _declared(self, given: dict[str, Array], model: str) -> dict[str, Array]:
        """The inputs given, in the model's declared order; every required one is there."""
        inputs: dict[str, Array] = {}
        for name, spec in self.inputs.items():
            if name in given:
                inputs[name] = given[name]
            elif not spec.optional:
                raise invalid(f"missing input '{name}' for model '{model}'")
        return inputs

    def _length(self, inputs: dict[str, Array], model: str) -> int:
        """The request's length: its padded inputs' size in their padded dimension, which
        they must agree on (they are padded together, and outputs cut back to it)."""
        first, *others = self._padded
        length = int(inputs[first.name].shape[first.axis])
        for pad in others:
            size = int(inputs[pad.name].shape[pad.axis])
            if size != length:
                raise invalid(
                    f"input '{pad.name}' holds {size} in its padded dimension and input "
                    f"'{first.name}' {length}: model '{model}' pads them together (pad_inputs "
                    "in its config), so they must be of one length"
                )
        return length

    def _given(self, request: InferRequest) -> tuple[dict[str, Array], int]:
        """Each input checked against its spec (name, datatype, shape, batch size, the
        config's limits) and reshaped for the model; and the request's batch size."""
        model = request.model_name
        given: dict[str, Array] = {}
        rows = -1
        for tensor in request.inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
                if tensor.name in self.server_inputs:
                    raise invalid(
                        f"input '{tensor.name}' is {self.server_inputs[tensor.name]} of model "
                        f"'{model}': the server supplies it, the request must not"
                    )
                raise invalid(
                    f"unexpected input '{tensor.name}' for model '{model}'; "
                    f"expected inputs: {', '.join(self.inputs) or '(none)'}"
                )
            if tensor.name in given:
                raise invalid(f"input '{tensor.name}' is given more than once")
            if tensor.datatype != spec.datatype:
                raise invalid(
                    f"input '{tensor.name}': datatype {tensor.datatype} does not match "
                    f"the model's {spec.datatype}"
                )
            shape = tensor.shape
            if self.is_batched:
                if len(shape) == 0:
                    raise invalid(
                        f"input '{tensor.name}': shape [] has no batch dimension; expected "
                        f"{self.metadata_shape(spec)}"
                    )
                batch, inner = shape[0], shape[1:]
                if batch < 1 or batch > self.max_batch_size:
                    raise invalid(
                        f"input '{tensor.name}': batch size {batch} is outside 1.."
                        f"{self.max_batch_size} (max_batch_size of model '{model}')"
                    )
                if rows not in (-1, batch):
                    raise invalid(
                        f"input '{tensor.name}': batch size {batch} differs from the other "
                        f"inputs' {rows}"
                    )
                rows = batch
            else:
                inner = shape
            if not spec.matches(inner):
                raise invalid(
                    f"input '{tensor.name}': shape {list(shape)} does not match the model's "
                    f"{self.metadata_shape(spec)}"
                )
            if tensor.name in self._limited:
                self._check_limits(tensor.name, spec, shape, inner, tensor.data)
            data = tensor.data
            if spec.reshape is not None:
                lead = (shape[0],) if self.is_batched else ()
                try:
                    data = data.reshape(lead + spec.reshape)
                except ValueError:
                    raise invalid(
                        f"input '{tensor.name}': shape {list(shape)} does not fit the model's "
                        f"reshape {list(spec.reshape)}"
                    ) from None
            given[tensor.name] = data
        return given, rows

    def _given_checked(self, request: InferRequest) -> tuple[dict[str, Array], int]:
        """`_given` for a request that passed it already: the same inputs and batch size,
        none of the checks (reshape cannot fail: `_given` tried it)."""
        given: dict[str, Array] = {}
        rows = -1
        for tensor in request.inputs:
            spec = self.inputs[tensor.name]
            data = tensor.data
            if self.is_batched:
                rows = tensor.shape[0]
            if spec.reshape is not None:
                data = data.reshape(((rows,) if self.is_batched else ()) + spec.reshape)
            given[tensor.name] = data
        return given, rows

    def _check_limits(
        self,
        name: str,
        spec: TensorSpec,
        shape: tuple[int, ...],
        inner: tuple[int, ...],
        data: Array,
    ) -> None:
        """The config's limits on one input; `shape` is as declared, batch included."""
        limits = self.limits
        bound = limits.max_shape.get(name)
        if bound is not None:
            for axis, (size, most) in enumerate(zip(inner, bound, strict=True)):
                if most != -1 and size > most:
                    raise invalid(
                        f"input '{name}': shape {list(shape)} exceeds the model's limit "
                        f"{list(bound)} (max_input_shape) in non-batch dimension {axis}: "
                        f"{size} > {most}"
                    )
        count = math.prod(shape)
        if count > limits.max_elements:
            raise invalid(
                f"input '{name}': shape {list(shape)} holds {count} elements, more than the "
                f"model's limit of {limits.max_elements} per input (max_input_elements)"
            )
        if spec.datatype == "BYTES" and data.size:
            flat = data.reshape(-1)
            sizes = np.fromiter(map(len, flat), dtype=np.int64, count=flat.size)
            k = int(np.argmax(sizes))
            if sizes[k] > limits.max_bytes_element_size:
                raise invalid(
                    f"input '{name}': BYTES element {k} holds {int(sizes[k])} bytes, more than "
                    f"the model's limit of {limits.max_bytes_element_size} "
                    "(max_bytes_element_size)"
                )
            if name in self.text_inputs:
                # The model takes text: bytes that aren't UTF-8 are this request's error,
                # found here rather than failing the batch it would share with others.
                check_utf8(name, flat)

    def _output_names(self, requested: list[RequestedOutput] | None, model: str) -> list[str]:
        if requested is None or len(requested) == 0:
            return list(self.outputs)
        names: list[str] = []
        for out in requested:
            if out.name not in self.outputs:
                raise invalid(
                    f"unknown output '{out.name}' requested from model '{model}'; "
                    f"it has outputs: {', '.join(self.outputs)}"
                )
            if out.name in names:
                # Each copy would be encoded again: 100,000 copies of one output turned a
                # 2.4 MiB request into a 562 MiB response. Triton refuses them too.
                raise invalid(f"output '{out.name}' is requested more than once")
            names.append(out.name)
        return names
