"""Build the example ONNX models from fixed seeds (no model binaries live in git).

    python examples/build_models.py [REPOSITORY]   # default: examples/models
    python examples/build_models.py --config-reference [REPOSITORY]   # examples/config-reference

Also imported by the tests, which build their own small models with the same helpers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _ir(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    return model


def mlp_weights(sizes: list[int], seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) per layer; the ONNX and the TorchScript MLP share them, so they agree."""
    rng = np.random.default_rng(seed)
    layers = []
    for n_in, n_out in zip(sizes, sizes[1:], strict=False):
        w = rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)).astype(np.float32)
        b = rng.normal(0, 0.01, n_out).astype(np.float32)
        layers.append((w, b))
    return layers


def mlp(sizes: list[int], seed: int, batch_dim: str | int = "batch") -> onnx.ModelProto:
    """An MLP classifier: input -> (Gemm, Relu)* -> Gemm -> probabilities, label."""
    nodes, inits = [], []
    current = "input"
    for k, (w, b) in enumerate(mlp_weights(sizes, seed)):
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        out = f"h{k}"
        nodes.append(helper.make_node("Gemm", [current, f"w{k}", f"b{k}"], [out]))
        current = out
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [current], [f"r{k}"]))
            current = f"r{k}"
    nodes.append(helper.make_node("Softmax", [current], ["probabilities"], axis=1))
    nodes.append(helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch_dim, sizes[0]])],
        [
            helper.make_tensor_value_info(
                "probabilities", TensorProto.FLOAT, [batch_dim, sizes[-1]]
            ),
            helper.make_tensor_value_info("label", TensorProto.INT64, [batch_dim, 1]),
        ],
        inits,
    )
    return _ir(graph)


def linear(n_in: int, n_out: int, seed: int) -> onnx.ModelProto:
    """y = x @ W + b with a variable batch dimension."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (n_in, n_out)).astype(np.float32)
    b = rng.normal(0, 1, n_out).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n_out])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    return _ir(graph)


def identity(onnx_type: int, dims: list[str | int]) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0, for any element type: exercises every datatype end to end."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", onnx_type, dims)],
        [helper.make_tensor_value_info("OUTPUT0", onnx_type, dims)],
    )
    return _ir(graph)


def ranker(dim: int, candidates: int, hidden: int, seed: int) -> onnx.ModelProto:
    """rank (the recall_rank example): an MLP scoring each candidate for the user,
    score = relu((user * candidate) @ W1 + b1) @ W2 + b2; USER [batch, dim] and
    CANDIDATE_VECS [batch, candidates, dim] -> SCORES [batch, candidates]."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(dim), (dim, hidden)).astype(np.float32)
    b1 = rng.normal(0, 0.01, hidden).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, 1)).astype(np.float32)
    b2 = np.zeros(1, np.float32)
    inits = [
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(b1, "B1"),
        numpy_helper.from_array(w2, "W2"),
        numpy_helper.from_array(b2, "B2"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["USER", "axis1"], ["user3"]),  # [batch, 1, dim]
        helper.make_node("Mul", ["CANDIDATE_VECS", "user3"], ["joint"]),
        helper.make_node("MatMul", ["joint", "W1"], ["h"]),
        helper.make_node("Add", ["h", "B1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["s"]),
        helper.make_node("Add", ["s", "B2"], ["sb"]),
        helper.make_node("Squeeze", ["sb", "axis2"], ["SCORES"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rank",
        [
            helper.make_tensor_value_info("USER", TensorProto.FLOAT, ["batch", dim]),
            helper.make_tensor_value_info(
                "CANDIDATE_VECS", TensorProto.FLOAT, ["batch", candidates, dim]
            ),
        ],
        [helper.make_tensor_value_info("SCORES", TensorProto.FLOAT, ["batch", candidates])],
        inits,
    )
    return _ir(graph)


def torch_mlp(sizes: list[int], seed: int, path: Path) -> None:
    """The same MLP as `mlp` (same weights), saved as TorchScript for the PyTorch backend."""
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList()
            for w, b in mlp_weights(sizes, seed):
                layer = torch.nn.Linear(w.shape[0], w.shape[1])
                layer.weight.data = torch.from_numpy(w.T.copy())
                layer.bias.data = torch.from_numpy(b)
                self.layers.append(layer)

        def forward(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = input
            for k, layer in enumerate(self.layers):
                x = layer(x)
                if k < len(self.layers) - 1:
                    x = torch.relu(x)
            probabilities = torch.softmax(x, dim=1)
            return probabilities, torch.argmax(probabilities, dim=1, keepdim=True)

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(MLP().eval()), str(path))


def build(repository: Path) -> None:
    _save(mlp([64, 1024, 1024, 16], seed=0), repository / "mlp" / "1" / "model.onnx")
    _save(linear(4, 2, seed=1), repository / "linear_noconfig" / "1" / "model.onnx")
    torch_mlp([64, 1024, 1024, 16], seed=0, path=repository / "mlp_torch" / "1" / "model.pt")
    # The recall_rank ensemble's ONNX stage (recall builds its table at load, topk is Python).
    _save(ranker(64, 200, 32, seed=3), repository / "rank" / "1" / "model.onnx")


def build_config_reference(repository: Path) -> None:
    """The files of examples/config-reference (its config.pbtxt lives in git): versions 1, 2
    and 3 of a small classifier (16 -> 32 -> 4), and the recorded warm-up request."""
    for version in (1, 2, 3):
        model = mlp([16, 32, 4], seed=100 + version)
        _save(model, repository / "classifier" / str(version) / "model.onnx")
    sample = repository / "classifier" / "warmup" / "sample_input"
    sample.parent.mkdir(parents=True, exist_ok=True)
    sample.write_bytes(np.linspace(-1, 1, 16, dtype="<f4").tobytes())


if __name__ == "__main__":
    args = sys.argv[1:]
    reference = "--config-reference" in args
    args = [a for a in args if a != "--config-reference"]
    default = "config-reference" if reference else "models"
    target = Path(args[0]) if args else Path(__file__).parent / default
    (build_config_reference if reference else build)(target)
    print(f"built example models in {target}")
