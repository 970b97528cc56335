"""A model's declared inputs and outputs, and the check of one request against them.

Everything a request can get wrong about tensors is caught here, at the edge, with a message
that names the input and what was expected: nothing malformed reaches the batcher or a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from inferd.datatypes import CONFIG_TO_V2, V2_TO_NUMPY
from inferd.errors import invalid
from inferd.types import Array, InferRequest, RequestedOutput


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 is any size
    reshape: tuple[int, ...] | None  # the shape the model itself sees / produces
    optional: bool = False

    def matches(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.dims) and all(
            d == -1 or d == s for d, s in zip(self.dims, shape, strict=True)
        )

    def wire_shape(self) -> list[int]:
        return list(self.dims)


@dataclass(slots=True)
class BoundRequest:
    """A request whose inputs passed the signature check, ready for the scheduler."""

    inputs: dict[str, Array]  # in the model's declared input order, reshaped for the model
    rows: int  # batch size of this request; 1 for unbatched models
    shape_key: tuple[tuple[int, ...], ...]  # non-batch shapes: only equal keys may be merged
    output_names: list[str]
    request_id: str = ""  # the client's request id, "" when it sent none


def _dims(spec_dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in spec_dims)


class ModelSignature:
    def __init__(self, config: mc.ModelConfig) -> None:
        self.max_batch_size = int(config.max_batch_size)
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
        self.outputs = {
            o.name: TensorSpec(
                o.name,
                CONFIG_TO_V2[o.data_type],
                _dims(o.dims),
                _dims(o.reshape.shape) if o.HasField("reshape") else None,
            )
            for o in config.output
        }

    @property
    def is_batched(self) -> bool:
        return self.max_batch_size > 0

    def metadata_shape(self, spec: TensorSpec) -> list[int]:
        """The shape a client sends or receives: a leading -1 when the model batches."""
        return ([-1] if self.is_batched else []) + list(spec.dims)

    def bind(self, request: InferRequest) -> BoundRequest:
        model = request.model_name
        given: dict[str, Array] = {}
        rows = -1
        for tensor in request.inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
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
        inputs: dict[str, Array] = {}
        for name, spec in self.inputs.items():
            if name in given:
                inputs[name] = given[name]
            elif not spec.optional:
                raise invalid(f"missing input '{name}' for model '{model}'")
        return BoundRequest(
            inputs=inputs,
            rows=rows if self.is_batched else 1,
            shape_key=tuple(a.shape[1:] for a in inputs.values()),
            output_names=self._output_names(request.outputs, model),
            request_id=request.id,
        )

    def _output_names(self, requested: list[RequestedOutput] | None, model: str) -> list[str]:
        if requested is None or len(requested) == 0:
            return list(self.outputs)
        names = []
        for out in requested:
            if out.name not in self.outputs:
                raise invalid(
                    f"unknown output '{out.name}' requested from model '{model}'; "
                    f"it has outputs: {', '.join(self.outputs)}"
                )
            names.append(out.name)
        return names

    def numpy_dtype_of_output(self, name: str) -> str:
        return V2_TO_NUMPY[self.outputs[name].datatype].name
