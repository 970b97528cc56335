"""What the Python-backend parity costs per call, in-process, no server:

- `ModelSignature.bind` of a request without parameters, and of one carrying three custom
  parameters to a Python model (which checks them and hands them over);
- a `TritonPythonModel` batch of one request with `def execute` and with `async def execute`
  (the coroutine runs on the instance's own event loop; the caller's thread waits for it).

.venv/bin/python benchmarks/python_model_calls.py [seconds per case]
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.backends.python.model_import import import_model_module
from inferd.backends.python.triton_model import TritonPythonInstance
from inferd.tensors.signature import ModelSignature
from inferd.types import InferRequest, Tensor

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    {prefix}def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
            for r in requests
        ]
"""


def per_call_us(call: Callable[[], object], seconds: float) -> float:
    for _ in range(200):
        call()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def main(seconds: float) -> None:
    config = mc.ModelConfig(name="m", backend="python", max_batch_size=8)
    config.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="IN", data_type=mc.TYPE_FP32, dims=[4])
    data = np.ones((1, 4), np.float32)
    plain = InferRequest("m", "", [Tensor("IN", "FP32", (1, 4), data)])
    with_params = InferRequest(
        "m", "", [Tensor("IN", "FP32", (1, 4), data)], parameters={"a": 1, "b": "x", "c": True}
    )
    signature = ModelSignature(config)
    took = per_call_us(lambda: signature.bind(plain), seconds)
    print(f"bind, no parameters:              {took:6.2f} µs")
    signature.model_parameters = True
    took = per_call_us(lambda: signature.bind(with_params), seconds)
    print(f"bind, 3 parameters, Python model: {took:6.2f} µs")
    bound = signature.bind(with_params)
    with tempfile.TemporaryDirectory() as tmp:
        for prefix in ("", "async "):
            version_dir = Path(tmp) / prefix.strip() / "m" / "1"
            version_dir.mkdir(parents=True)
            (version_dir / "model.py").write_text(textwrap.dedent(MODEL.format(prefix=prefix)))
            ctx = LoadContext("m", "1", version_dir, config, 0, 1)
            instance = TritonPythonInstance(ctx, import_model_module("m", version_dir))
            took = per_call_us(lambda i=instance: i.execute_requests([bound]), seconds)
            print(f"{prefix or 'sync '}def execute, 1 request:      {took:6.2f} µs")
            instance.close()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
