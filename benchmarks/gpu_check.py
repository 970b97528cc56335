"""The GPU path of the PyTorch backend, run by hand on a machine with CUDA.

    python benchmarks/gpu_check.py

CI has no GPU: the tests cover the CPU path and the KIND_GPU fallback. This script checks
what only a GPU can show: an instance of kind GPU lands on cuda:0, computes what the CPU
computes, batches through the DynamicBatcher, and torch.compile compiles at load on CUDA.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from inferd.backends.base import LoadContext  # noqa: E402
from inferd.backends.torch import TorchBackend  # noqa: E402
from inferd.repository.spec import batching_options  # noqa: E402
from inferd.scheduling.batcher import DynamicBatcher  # noqa: E402
from inferd.tensors.signature import ModelSignature  # noqa: E402

CONFIG = """
name: "gpu_mlp"
platform: "pytorch_libtorch"
max_batch_size: 32
input [ { name: "x", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]
"""


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def load(version_dir: Path, extra: str) -> tuple[object, mc.ModelConfig]:
    config = mc.ModelConfig()
    text_format.Parse(textwrap.dedent(CONFIG) + extra, config)
    TorchBackend().complete_config(config, version_dir)
    return TorchBackend().load(LoadContext("gpu_mlp", "1", version_dir, config, 0, 1)), config


async def batched(instance: object, config: mc.ModelConfig, x: np.ndarray) -> np.ndarray:
    from inferd.types import InferRequest, Tensor

    batcher = DynamicBatcher("gpu_mlp", [instance], batching_options(config))  # type: ignore[list-item]
    signature = ModelSignature(config)

    async def one(row: np.ndarray) -> np.ndarray:
        request = InferRequest("gpu_mlp", "", [Tensor("x", "FP32", (1, 64), row[None, :])])
        outputs, _ = await batcher.submit(signature.bind(request))
        return outputs["y"]

    results = await asyncio.gather(*(one(row) for row in x))
    executions = len(batcher.executions)
    await batcher.stop()
    print(f"  {len(x)} concurrent requests ran as {executions} GPU executions")
    return np.concatenate(results)


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA here: run this on the GPU machine"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    model = MLP().eval()
    x = np.random.default_rng(1).normal(size=(64, 64)).astype(np.float32)
    with torch.inference_mode():
        expected = model(torch.from_numpy(x)).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        version_dir = Path(tmp) / "1"
        version_dir.mkdir()
        torch.jit.save(torch.jit.script(model), str(version_dir / "model.pt"))
        instance, config = load(version_dir, "")
        print(f"TorchScript, KIND_GPU: instance on {instance.device}")  # type: ignore[attr-defined]
        assert instance.device == "cuda:0"  # type: ignore[attr-defined]
        got = instance.execute({"x": x})["y"]  # type: ignore[attr-defined]
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(
            asyncio.run(batched(instance, config, x)), expected, rtol=1e-3, atol=1e-4
        )
        instance.close()  # type: ignore[attr-defined]

        (version_dir / "model.pt").unlink()
        batch = torch.export.Dim("batch", max=32)
        program = torch.export.export(
            model, (torch.zeros(2, 64),), dynamic_shapes={"x": {0: batch}}
        )
        torch.export.save(program, str(version_dir / "model.pt2"))
        compiled, _ = load(
            version_dir, 'parameters { key: "torch_compile" value: { string_value: "true" } }'
        )
        print(f"torch.export + torch.compile, KIND_GPU: instance on {compiled.device}")  # type: ignore[attr-defined]
        got = compiled.execute({"x": x[:5]})["y"]  # type: ignore[attr-defined]
        np.testing.assert_allclose(got, expected[:5], rtol=1e-3, atol=1e-4)
        compiled.close()  # type: ignore[attr-defined]
    print("GPU path OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
