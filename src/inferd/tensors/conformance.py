"""Does what a model produced match the outputs its config declares?

One check for every caller: the request path (each response's outputs) and warm-up (a
version whose outputs contradict its config never becomes READY). Messages name the output
and `<model>/config.pbtxt`, so the fix is obvious whichever of the two found it.
"""

from __future__ import annotations

import numpy as np

from inferd.datatypes import V2_TO_NUMPY
from inferd.errors import ErrorKind, InferdError
from inferd.tensors.signature import ModelSignature, TensorSpec
from inferd.types import Array, Tensor


class OutputMismatchError(InferdError):
    """The model answered, but an output is missing or has a dtype or shape its config
    does not allow: every request would fail the same way."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.MODEL_ERROR, message)


def conform_output(
    signature: ModelSignature, spec: TensorSpec, outputs: dict[str, Array], rows: int
) -> Tensor:
    """One output checked against the config: dtype (cast when safe), batch size, shape,
    reshape. Raises `OutputMismatchError`; the caller adds which model and version."""
    where = signature.config_file
    array = outputs.get(spec.name)
    if array is None:
        produced = ", ".join(f"'{n}'" for n in outputs) or "none"
        raise OutputMismatchError(
            f"produced no output '{spec.name}', which {where} declares (it produced {produced})"
        )
    if spec.datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise OutputMismatchError(
                f"output '{spec.name}' is {array.dtype}, but {where} declares it TYPE_STRING "
                "(BYTES)"
            )
    else:
        want = V2_TO_NUMPY[spec.datatype]
        if array.dtype != want:
            if not np.can_cast(array.dtype, want, casting="same_kind"):
                raise OutputMismatchError(
                    f"output '{spec.name}' is {array.dtype}, which does not convert to the "
                    f"{spec.datatype} that {where} declares"
                )
            array = array.astype(want)
    batched = signature.is_batched
    if batched and (array.ndim == 0 or array.shape[0] != rows):
        raise OutputMismatchError(
            f"output '{spec.name}' has shape {list(array.shape)} for a batch of {rows}: "
            f"{where} sets max_batch_size, so its first dimension must be the batch size"
        )
    if spec.reshape is not None and -1 not in spec.dims:
        lead = (rows,) if batched else ()
        try:
            array = array.reshape(lead + spec.dims)
        except ValueError:
            raise OutputMismatchError(
                f"output '{spec.name}' has shape {list(array.shape)}, which does not fit "
                f"the dims {list(spec.dims)} that {where} declares"
            ) from None
    inner = array.shape[1:] if batched else array.shape
    if not spec.matches(inner):
        raise OutputMismatchError(
            f"output '{spec.name}' has shape {list(array.shape)}, but {where} declares "
            f"{signature.metadata_shape(spec)}"
        )
    return Tensor(spec.name, spec.datatype, tuple(array.shape), array)
