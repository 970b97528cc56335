"""`pb_utils.Tensor` and the data-type tables and BYTES helpers of Triton's Python backend."""

from __future__ import annotations

import importlib
import struct
from types import ModuleType
from typing import Any

import numpy as np

from inferd.backends.python.pb_utils.triton_errors import TritonModelException
from inferd.types import Array

# Config `data_type` strings, as in the model_config JSON that `initialize` receives.
TRITON_STRING_TO_NUMPY: dict[str, type[Any]] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType codes (1 = BOOL ... 13 = BYTES), which `Tensor.triton_dtype()` returns.
_TRITON_CODES: dict[int, type[Any]] = dict(enumerate(TRITON_STRING_TO_NUMPY.values(), start=1))
_NUMPY_TO_CODE: dict[np.dtype[Any], int] = {np.dtype(t): c for c, t in _TRITON_CODES.items()}
_BYTES_CODE = 13
_DLPACK_CPU = 1  # DLPack's kDLCPU device type


def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """ "TYPE_FP32" -> np.float32, "TYPE_STRING" -> np.object_."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type[Any] | None:
    return _TRITON_CODES.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType code of a numpy dtype (bytes/str/object are BYTES)."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OS":
        return _BYTES_CODE
    return _NUMPY_TO_CODE.get(dtype.newbyteorder("="))


def serialize_byte_tensor(input_tensor: Array) -> bytes | tuple[()] | None:
    """A BYTES tensor in Triton's wire form: each element as a 4-byte little-endian length
    and its bytes, in C order. `()` for an empty tensor, None for a non-BYTES dtype (as in
    Triton)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in "OS":
        return None
    parts: list[bytes] = []
    for item in input_tensor.ravel(order="C").tolist():
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> Array:
    """The reverse of `serialize_byte_tensor`: a 1-D object array of bytes."""
    view = memoryview(encoded_tensor)
    elements: list[bytes] = []
    offset = 0
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise TritonModelException(
                f"deserialize_bytes_tensor: an element of {length} bytes runs past the end of "
                f"the {len(view)}-byte buffer"
            )
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    return array


def _torch_dlpack() -> ModuleType:
    try:
        return importlib.import_module("torch.utils.dlpack")
    except ImportError:
        raise TritonModelException(
            "Tensor.from_dlpack of a bare DLPack capsule needs torch, which is not installed; "
            "pass an object with __dlpack__ (a numpy array) or use Tensor(name, numpy_array)"
        ) from None


class Tensor:
    """A named input or output tensor, held as a numpy array in CPU memory."""

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        array: Array = np.asarray(numpy_array)
        if array.dtype.type is np.str_ or array.dtype.kind == "V":
            raise TritonModelException(
                f"Tensor '{name}': numpy dtype {array.dtype} is not supported by the Python "
                "backend; use np.object_ (elements bytes or str) instead"
            )
        if triton_dtype is not None:
            wanted = triton_to_numpy_type(triton_dtype)
            if wanted is None:
                raise TritonModelException(f"Tensor '{name}': unknown triton_dtype {triton_dtype}")
            if array.dtype != wanted:
                array = array.view(wanted)  # reinterpret the bytes, as Triton does
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Array:
        return self._array

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def _exportable(self) -> Array:
        if self._array.dtype.kind == "O":
            raise TritonModelException(f"Tensor '{self._name}': BYTES tensors have no DLPack form")
        array = np.ascontiguousarray(self._array)
        # Request inputs are read-only views of the request body, and a legacy DLPack
        # capsule cannot say "read-only": hand out a copy rather than writable memory.
        return array if array.flags.writeable else array.copy()

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (BYTES tensors have none)."""
        return self._exportable().__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._exportable().__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_capsule: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with `__dlpack__` (a torch tensor, a
        numpy array). Data on a GPU is copied to host memory: inferd's Python models work on
        CPU tensors."""
        if hasattr(dlpack_capsule, "__dlpack_device__"):
            device, _ = dlpack_capsule.__dlpack_device__()
            if int(device) == _DLPACK_CPU:
                return Tensor(name, np.from_dlpack(dlpack_capsule))
        tensor = _torch_dlpack().from_dlpack(dlpack_capsule)
        return Tensor(name, tensor.detach().cpu().numpy())
