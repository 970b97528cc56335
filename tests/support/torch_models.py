"""TorchScript and torch.export models the PyTorch tests build for themselves."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3


class Pickled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _config(path: Path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.pbtxt").write_text(textwrap.dedent(text), encoding="utf-8")


def build_torch_repository(repo: Path, builders: object) -> None:
    # TorchScript MLP, tensors matched by forward's argument name and the tuple's order.
    builders.torch_mlp([8, 16, 4], seed=21, path=repo / "ts_mlp" / "1" / "model.pt")  # type: ignore[attr-defined]
    _config(
        repo / "ts_mlp",
        """
        name: "ts_mlp"
        platform: "pytorch_libtorch"
        max_batch_size: 16
        input [ { name: "input", data_type: TYPE_FP32, dims: [ 8 ] } ]
        output [
          { name: "probabilities", data_type: TYPE_FP32, dims: [ 4 ] },
          { name: "label", data_type: TYPE_INT64, dims: [ 1 ] }
        ]
        dynamic_batching { }
        """,
    )
    # Triton's INPUT__i / OUTPUT__i convention; outputs declared out of order on purpose.
    (repo / "ts_indexed" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(AddSub()), str(repo / "ts_indexed" / "1" / "model.pt"))
    _config(
        repo / "ts_indexed",
        """
        name: "ts_indexed"
        backend: "pytorch"
        max_batch_size: 8
        input [
          { name: "INPUT__0", data_type: TYPE_INT32, dims: [ 3 ] },
          { name: "INPUT__1", data_type: TYPE_INT32, dims: [ 3 ] }
        ]
        output [
          { name: "OUTPUT__1", data_type: TYPE_INT32, dims: [ 3 ] },
          { name: "OUTPUT__0", data_type: TYPE_INT32, dims: [ 3 ] }
        ]
        """,
    )
    # A torch.export program with a dynamic batch dimension.
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(Scale(), (torch.zeros(2, 5),), dynamic_shapes={"x": {0: batch}})
    (repo / "exported" / "1").mkdir(parents=True)
    torch.export.save(program, str(repo / "exported" / "1" / "model.pt2"))
    exported_config = """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 32
        input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 5 ] }} ]
        output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 5 ] }} ]
        dynamic_batching {{ }}
        {extra}
        """
    _config(repo / "exported", exported_config.format(name="exported", extra=""))
    # The same program compiled with torch.compile during load.
    (repo / "compiled" / "1").mkdir(parents=True)
    torch.export.save(program, str(repo / "compiled" / "1" / "model.pt2"))
    _config(
        repo / "compiled",
        exported_config.format(
            name="compiled",
            extra='parameters { key: "torch_compile" value: { string_value: "true" } }',
        ),
    )
    # A pickled nn.Module is refused: loading it would unpickle arbitrary objects.
    (repo / "pickled" / "1").mkdir(parents=True)
    torch.save(Pickled(), str(repo / "pickled" / "1" / "model.pt"))
    _config(
        repo / "pickled",
        """
        name: "pickled"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 2 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
        """,
    )
    # Asks for a GPU: on a CPU-only machine it must warn and still serve.
    (repo / "wants_gpu" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(Scale()), str(repo / "wants_gpu" / "1" / "model.pt"))
    _config(
        repo / "wants_gpu",
        """
        name: "wants_gpu"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 2 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
        instance_group [ { count: 1, kind: KIND_GPU } ]
        """,
    )
