"""Models for the `inferd optimize` tests: an MLP that INT8 keeps, a classifier whose weights
INT8 cannot hold, the TorchScript MLP, and small sentence-embedding models (token ids in,
a unit vector out) that INT8 keeps or cannot hold."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import builders

CLASSIFIER_CONFIG = """
name: "{name}"
platform: "{platform}"
max_batch_size: 8
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ {n_in} ] }} ]
output [
  {{ name: "probabilities", data_type: TYPE_FP32, dims: [ {n_out} ] }},
  {{ name: "label", data_type: TYPE_INT64, dims: [ 1 ] }}
]
dynamic_batching {{ }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
{extra}
"""

# Wide enough that INT8 is faster on a CPU (measured: docs/benchmarks.md), small enough to
# build and time in a test. The tests never depend on the speed (--min-speedup 0).
MLP_SIZES = [64, 1024, 1024, 16]  # the example MLP's


def write_config(model_dir: Path, platform: str, n_in: int, n_out: int, extra: str = "") -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    text = CLASSIFIER_CONFIG.format(
        name=model_dir.name, platform=platform, n_in=n_in, n_out=n_out, extra=extra
    )
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def write_mlp(repo: Path, name: str = "mlp", extra: str = "", seed: int = 0) -> Path:
    model_dir = repo / name
    builders._save(builders.mlp(MLP_SIZES, seed=seed), model_dir / "1" / "model.onnx")
    write_config(model_dir, "onnxruntime_onnx", MLP_SIZES[0], MLP_SIZES[-1], extra)
    return model_dir


def write_torch_mlp(repo: Path, name: str = "mlp_torch") -> Path:
    model_dir = repo / name
    builders.torch_mlp(MLP_SIZES, seed=0, path=model_dir / "1" / "model.pt")
    write_config(model_dir, "pytorch_libtorch", MLP_SIZES[0], MLP_SIZES[-1])
    return model_dir


def outlier_classifier(n_in: int = 64, n_out: int = 16, seed: int = 0) -> onnx.ModelProto:
    """logits = x @ W with W's first row 1000 in every class and the rest ~0.01: the common
    term cancels in softmax and argmax, so the class lives in the small weights. INT8 (per
    tensor or per channel: every column holds a 1000) rounds them all to zero."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.01, (n_in, n_out)).astype(np.float32)
    w[0, :] = 1000.0
    b = np.zeros(n_out, np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
            helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=1),
        ],
        "outlier_classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_in])],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", n_out]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch", 1]),
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", builders.OPSET)])
    model.ir_version = 8
    return model


def write_outlier_classifier(repo: Path, name: str = "outlier") -> Path:
    model_dir = repo / name
    builders._save(outlier_classifier(), model_dir / "1" / "model.onnx")
    write_config(model_dir, "onnxruntime_onnx", 64, 16)
    return model_dir


EMBEDDING_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "input_ids", data_type: TYPE_INT64, dims: [ {tokens} ] }},
  {{ name: "attention_mask", data_type: TYPE_INT64, dims: [ {tokens} ] }}
]
output [ {{ name: "embedding", data_type: TYPE_FP32, dims: [ {width} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""
EMBEDDING_VOCABULARY = 1000
EMBEDDING_WIDTH = 32


def embedding_encoder(
    outlier: bool, tokens: int | None = None, seed: int = 0, width: int = EMBEDDING_WIDTH
) -> onnx.ModelProto:
    """input_ids, attention_mask [batch, tokens] -> table lookup -> MatMul W -> mean over
    the mask -> L2 normalisation: `embedding` [batch, width] of unit length, as a sentence
    encoder computes it. `tokens`: a fixed sequence length (None: variable).

    `outlier`: the table's first column is 0 and W's first row 1000, so that row never
    contributes, while the rest of W (std 8) is what the embedding is made of. INT8 with one
    scale per tensor (1000 / 127) rounds those weights to steps of ~7.9: the vectors turn
    by ~15 degrees. Without it, W is N(0, 1) and INT8 keeps the vectors (cosine > 0.999)."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((EMBEDDING_VOCABULARY, 64)).astype(np.float32)
    w = rng.standard_normal((64, width)).astype(np.float32)
    if outlier:
        table[:, 0] = 0.0
        w *= 8.0
        w[0, :] = 1000.0
    sequence: str | int = "tokens" if tokens is None else tokens
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["looked_up"]),
            helper.make_node("MatMul", ["looked_up", "w"], ["hidden"]),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
            helper.make_node("Mul", ["hidden", "mask3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "one"], ["summed"], keepdims=0),
            helper.make_node("ReduceSum", ["mask3", "one"], ["count"], keepdims=0),
            helper.make_node("Max", ["count", "tiny"], ["divisor"]),
            helper.make_node("Div", ["summed", "divisor"], ["pooled"]),
            helper.make_node("LpNormalization", ["pooled"], ["embedding"], axis=1, p=2),
        ],
        "embedding_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", sequence]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", sequence]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([1e-9], np.float32), "tiny"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", builders.OPSET)])
    model.ir_version = 8
    return model


def write_embedding_encoder(
    repo: Path, name: str, outlier: bool = False, tokens: int | None = None
) -> Path:
    model_dir = repo / name
    builders._save(embedding_encoder(outlier, tokens), model_dir / "1" / "model.onnx")
    text = EMBEDDING_CONFIG.format(
        name=name, tokens=-1 if tokens is None else tokens, width=EMBEDDING_WIDTH
    )
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return model_dir


def token_samples(count: int, seed: int, longest: int = 12) -> dict[str, np.ndarray]:
    """`count` random "sentences" of 3 to `longest` token ids, padded with 0 to the longest,
    with their attention mask: what examples/tokenize_sentences.py writes for real text."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, longest + 1, count)
    ids = np.zeros((count, longest), np.int64)
    mask = np.zeros((count, longest), np.int64)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(1, EMBEDDING_VOCABULARY, length)
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


def write_unit_vectors(repo: Path, name: str = "unit", width: int = 16) -> Path:
    """x FP32 [batch, width] -> MatMul -> L2 normalisation: an embedding of float inputs,
    which synthetic samples can feed."""
    w = np.random.default_rng(4).standard_normal((width, width)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["projected"]),
            helper.make_node("LpNormalization", ["projected"], ["embedding"], axis=1, p=2),
        ],
        "unit_vectors",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", builders.OPSET)])
    model.ir_version = 8
    model_dir = repo / name
    builders._save(model, model_dir / "1" / "model.onnx")
    return model_dir  # no config: completed from the file (max_batch_size 4)
