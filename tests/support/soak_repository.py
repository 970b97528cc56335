"""The soak's model repository (benchmarks/soak.py, tests/integration/reliability/test_soak.py):
a copy of examples/models in the soak's own folder, with the changes a production
deployment of them would make, and the writers of its hot swaps and canary steps.

Changes to the copy, each asserted so that a change of the examples fails loudly:

- `mlp`: two versions kept (`latest 2`, for the canary), the response cache on, and a queue
  bound (`max_queue_size`), so that a burst far past its capacity is shed with 429 rather
  than queued without end;
- `mlp_torch`, `text_stats`, `add_sub`, `recall_rank` (the ensemble): the response cache on;
- `text_stats_raw`: `text_stats` without its `text_inputs` parameter, so a text that is not
  UTF-8 reaches the model, which raises (issue 34's first finding: one client's bad inputs
  must not take the replica's readiness).

`linear_noconfig` (no config.pbtxt) and `word_stream` (decoupled) are served as they are.
The minilm models (a real BERT encoder, built from a package) are left out: no soak request
reaches them, and every worker would load the encoder's 90 MB for nothing.

A swap writes a new version folder through a staging folder and moves it in whole, the way
docs/lifecycle.md says to, and removes the version two before it (no longer served); the
server (poll mode) loads the new version beside the old one and switches. The canary's
steps rewrite mlp's `canary_weights` parameter: `--workers N` refuses the routing API (each
worker would see its own), so the weights travel in the config, which every worker reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.models import builders

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
MLP_SIZES = [64, 1024, 1024, 16]
MLP_CANARY_SEED = 7  # docs/lifecycle.md's walkthrough builds its version 2 with it
MLP_QUEUE_BOUND = 32
CACHE = "response_cache { enable: true }\n"
WEIGHTS_MARK = "# soak: canary weights\n"
# The ONNX and TorchScript files examples/build_models.py writes (not in git).
BUILT = (
    "mlp/1/model.onnx",
    "linear_noconfig/1/model.onnx",
    "mlp_torch/1/model.pt",
    "rank/1/model.onnx",
)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{path}: '{old.strip()}' not found (did the example change?)"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("\n" + text)


def write_repository(repo: Path) -> None:
    """The example models, built where examples/models lacks their files, with the soak's
    changes (the module's docstring)."""
    left_out = shutil.ignore_patterns("__pycache__", *builders.MINILM_MODELS)
    shutil.copytree(EXAMPLES, repo, ignore=left_out)
    if not all((repo / f).exists() for f in BUILT):
        builders.build(repo, minilm=False)
    mlp = repo / "mlp" / "config.pbtxt"
    _edit(mlp, 'platform: "onnxruntime_onnx"\n', 'platform: "onnxruntime_onnx"\n'
          "version_policy: { latest: { num_versions: 2 } }\n")  # fmt: skip
    _edit(
        mlp,
        "max_queue_delay_microseconds: 2000\n",
        "max_queue_delay_microseconds: 2000\n"
        f"  default_queue_policy {{ max_queue_size: {MLP_QUEUE_BOUND} }}\n",
    )
    for name in ("mlp", "mlp_torch", "text_stats", "add_sub", "recall_rank"):
        _append(repo / name / "config.pbtxt", CACHE)
    raw = repo / "text_stats_raw"
    shutil.copytree(repo / "text_stats", raw)
    config = raw / "config.pbtxt"
    _edit(config, 'name: "text_stats"', 'name: "text_stats_raw"')
    _edit(config, 'parameters { key: "text_inputs" value: { string_value: "text" } }\n', "")
    _edit(config, CACHE, "")  # every request reaches the model
    _append(mlp, WEIGHTS_MARK)


def mlp_canary_onnx() -> bytes:
    """mlp version 2: the same network with other weights."""
    model = builders.mlp(MLP_SIZES, seed=MLP_CANARY_SEED)
    out: bytes = model.SerializeToString()
    return out


def linear_onnx(version: int) -> bytes:
    """linear_noconfig version `version`: y = x @ W + b, its weights from seed `version`
    (version 1 is examples/build_models.py's)."""
    out: bytes = builders.linear(4, 2, seed=version).SerializeToString()
    return out


def _move_in(repo: Path, model: str, version: int, files: dict[str, bytes]) -> None:
    staging = repo.parent / "staging" / f"{model}-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, content in files.items():
        (staging / name).write_bytes(content)
    staging.rename(repo / model / str(version))


def swap_linear(repo: Path, version: int) -> None:
    """linear_noconfig's version `version` in, version - 2 out."""
    shutil.rmtree(repo / "linear_noconfig" / str(version - 2), ignore_errors=True)
    _move_in(repo, "linear_noconfig", version, {"model.onnx": linear_onnx(version)})


def swap_text_stats(repo: Path, version: int) -> None:
    """text_stats' version `version` (its model.py again: a new version to load and warm,
    the same answers) in, version - 2 out."""
    shutil.rmtree(repo / "text_stats" / str(version - 2), ignore_errors=True)
    source = (EXAMPLES / "text_stats" / "1" / "model.py").read_bytes()
    _move_in(repo, "text_stats", version, {"model.py": source})


def set_mlp_weights(repo: Path, weights: dict[str, int]) -> None:
    """mlp's `canary_weights` parameter (the line after the soak's mark), written whole."""
    config = repo / "mlp" / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    head = text[: text.index(WEIGHTS_MARK) + len(WEIGHTS_MARK)]
    value = json.dumps(weights).replace('"', '\\"')
    line = f'parameters {{ key: "canary_weights" value: {{ string_value: "{value}" }} }}\n'
    tmp = config.with_suffix(".tmp")
    tmp.write_text(head + line, encoding="utf-8")
    tmp.replace(config)


def add_mlp_canary(repo: Path) -> None:
    _move_in(repo, "mlp", 2, {"model.onnx": mlp_canary_onnx()})


def remove_mlp_canary(repo: Path) -> None:
    shutil.rmtree(repo / "mlp" / "2")
