"""A sample infer request for the HTTP tests."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        words = ["alpha", "béta", "", "gamma delta", "ω"]
        flat = [words[i % len(words)].encode() for i in range(int(np.prod(shape)))]
        return np.array(flat, dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    dtype = httpclient.triton_to_np_dtype(datatype)
    if np.issubdtype(dtype, np.floating):
        return rng.normal(0, 100, shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
