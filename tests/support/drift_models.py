"""Models with drift monitoring, built by the tests: a 64-feature ONNX MLP classifier with a
reference of standard-normal rows beside it (tests/integration/monitoring/test_drift.py,
test_deploy)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from inferd.monitoring.reference import npz_bytes
from tests.support.models import builders

FEATURES = 64
SHIFTED = (5, 17, 40)  # the features a drift test shifts


def reference_rows(rows: int = 2000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, FEATURES)).astype(np.float32)


def live_rows(rng: np.random.Generator, rows: int, shift: float = 0.0) -> np.ndarray:
    """Rows as the reference's, with `shift` standard deviations added to SHIFTED."""
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    x[:, SHIFTED] += shift
    return x


def write_drift_model(
    repo: Path,
    name: str,
    parameters: dict[str, str],
    reference: bytes | None = None,
    max_batch_size: int = 64,
) -> None:
    """`reference`: the bytes of `<version>/reference.npz` (default: 2000 reference rows)."""
    builders._save(builders.mlp([FEATURES, 16, 4], seed=7), repo / name / "1" / "model.onnx")
    params = "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in parameters.items()
    )
    config = textwrap.dedent(f"""
        name: "{name}"
        platform: "onnxruntime_onnx"
        max_batch_size: {max_batch_size}
        input [ {{ name: "input", data_type: TYPE_FP32, dims: [ {FEATURES} ] }} ]
        output [
          {{ name: "probabilities", data_type: TYPE_FP32, dims: [ 4 ] }},
          {{ name: "label", data_type: TYPE_INT64, dims: [ 1 ] }}
        ]
        dynamic_batching {{ }}
        """)
    (repo / name / "config.pbtxt").write_text(config + params, encoding="utf-8")
    data = reference if reference is not None else npz_bytes({"input": reference_rows()})
    (repo / name / "1" / "reference.npz").write_bytes(data)
