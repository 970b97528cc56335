"""The v2 datatype names, Triton's config TYPE_* enum and numpy dtypes, mapped once.

numpy has no bfloat16: BF16 tensors are arrays of `ml_dtypes.bfloat16` (the numpy dtype
tritonclient itself uses for BF16), 2 bytes per element, so they decode and encode like
any other fixed-size type. Only JSON (numbers) and the backends (torch, ONNX Runtime) need
a conversion, and each does it at its edge.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.errors import invalid

BF16: np.dtype[np.generic] = np.dtype(ml_dtypes.bfloat16)

# BYTES tensors are numpy object arrays holding `bytes` elements.
V2_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "BF16": BF16,
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

# Little-endian wire dtypes for the binary tensor extension.
V2_TO_WIRE: dict[str, np.dtype[np.generic]] = {
    k: v.newbyteorder("<") for k, v in V2_TO_NUMPY.items() if k != "BYTES"
}

NUMPY_TO_V2: dict[np.dtype[np.generic], str] = {v: k for k, v in V2_TO_NUMPY.items()}

CONFIG_TO_V2: dict[int, str] = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_UINT8: "UINT8",
    mc.TYPE_UINT16: "UINT16",
    mc.TYPE_UINT32: "UINT32",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT8: "INT8",
    mc.TYPE_INT16: "INT16",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_FP16: "FP16",
    mc.TYPE_BF16: "BF16",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_FP64: "FP64",
    mc.TYPE_STRING: "BYTES",
}
V2_TO_CONFIG: dict[str, int] = {v: k for k, v in CONFIG_TO_V2.items()}

ITEMSIZE: dict[str, int] = {k: v.itemsize for k, v in V2_TO_WIRE.items()}


def numpy_dtype(datatype: str, where: str) -> np.dtype[np.generic]:
    try:
        return V2_TO_NUMPY[datatype]
    except KeyError:
        raise invalid(
            f"{where}: unknown datatype '{datatype}', expected one of {', '.join(V2_TO_NUMPY)}"
        ) from None


def v2_datatype(dtype: np.dtype[np.generic], where: str) -> str:
    """The v2 name of a numpy dtype; str/bytes/object arrays are all BYTES."""
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return NUMPY_TO_V2[dtype.newbyteorder("=")]
    except KeyError:
        raise invalid(f"{where}: numpy dtype {dtype} has no v2 datatype") from None
