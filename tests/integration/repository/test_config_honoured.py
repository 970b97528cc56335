"""Nothing in a config is silently ignored, seen from a client (HTTP and gRPC, Triton's clients).

A refused field leaves its model UNAVAILABLE with the file and field in the reason, while the
others serve; a KIND_GPU instance without a GPU warns at load, and the config API and the
metrics report the kind and device actually used (Triton's hint semantics).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import write_plus_model
from tests.support.metrics_scrape import scrape, value
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server
from tests.support.torch_models import Scale

GPU_GROUP = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]"

TORCH_CONFIG = """
name: "torch_gpu"
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "x", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
instance_group [ { count: 1, kind: KIND_GPU } ]
"""

TRITON_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.info = f"{args['model_instance_kind']} {args['model_instance_name']}".encode()

    def execute(self, requests):
        info = np.array([self.info], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", info)]) for _ in requests]
"""

TRITON_CONFIG = """
name: "python_gpu"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] } ]
instance_group [ { name: "wants_gpu", count: 1, kind: KIND_GPU } ]
"""

# (model, what its config adds, the field path its load error names)
REFUSED = [
    (
        "iterative",
        "sequence_batching { iterative_sequence: true }",
        "sequence_batching.iterative_sequence",
    ),
    ("tagged", "metric_tags { key: 'team' value: 'a' }", "metric_tags"),
    (
        "decoupled",
        "model_transaction_policy { decoupled: true }",
        "model_transaction_policy.decoupled",
    ),
    (
        "unknown_key",
        'parameters { key: "enable_mem_arena" value: { string_value: "0" } }',
        "parameters.enable_mem_arena",
    ),
]

GPU_MODELS = ["onnx_gpu", "torch_gpu", "python_gpu"]


@pytest.fixture(scope="module")
def honoured(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, list[logging.LogRecord]]]:
    if "CUDAExecutionProvider" in ort.get_available_providers() or torch.cuda.is_available():
        pytest.skip("this machine has CUDA: KIND_GPU is honoured, not a hint")
    repo = tmp_path_factory.mktemp("honoured_repo")
    write_plus_model(repo, "onnx_gpu", [1], extra=GPU_GROUP)
    write_plus_model(
        repo,
        "onnx_groups",
        [1],
        extra='instance_group [ { name: "a", count: 1, kind: KIND_CPU }, '
        '{ name: "b", count: 2, kind: KIND_AUTO } ]',
    )
    (repo / "torch_gpu" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(Scale()), str(repo / "torch_gpu" / "1" / "model.pt"))
    (repo / "torch_gpu" / "config.pbtxt").write_text(TORCH_CONFIG)
    (repo / "python_gpu" / "1").mkdir(parents=True)
    (repo / "python_gpu" / "1" / "model.py").write_text(TRITON_PY)
    (repo / "python_gpu" / "config.pbtxt").write_text(TRITON_CONFIG)
    for name, extra, _ in REFUSED:
        write_plus_model(repo, name, [1])
        config = repo / name / "config.pbtxt"  # sequence_batching replaces dynamic_batching
        config.write_text(config.read_text().replace("dynamic_batching { }", extra))
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[assignment, method-assign]
    logger = logging.getLogger("inferd.backends")
    logger.addHandler(handler)
    try:
        with run_server(repo, admin_api=True) as running:
            yield running, records
    finally:
        logger.removeHandler(handler)


@pytest.fixture(params=PROTOCOLS)
def client(
    request: pytest.FixtureRequest, honoured: tuple[RunningServer, list[logging.LogRecord]]
) -> Iterator[Client]:
    c = Client(request.param, honoured[0])
    yield c
    c.raw.close()


def _groups(client: Client, model: str) -> list[dict[str, object]]:
    if client.protocol == "http":
        config = client.raw.get_model_config(model)
    else:
        config = client.raw.get_model_config(model, as_json=True)["config"]
    return list(config["instance_group"])


@pytest.mark.parametrize("model", GPU_MODELS)
def test_kind_gpu_without_a_gpu_reports_the_cpu_it_ran_on(client: Client, model: str) -> None:
    (group,) = _groups(client, model)
    assert group["kind"] == "KIND_CPU"
    assert not group.get("gpus")  # no GPU was used: a config sent back loads again


def test_each_instance_group_keeps_its_own_kind(client: Client) -> None:
    groups = _groups(client, "onnx_groups")
    assert [(g["name"], int(g["count"]), g["kind"]) for g in groups] == [  # type: ignore[call-overload]
        ("a", 1, "KIND_CPU"),
        ("b", 2, "KIND_CPU"),  # KIND_AUTO resolved to what it ran on
    ]


@pytest.mark.parametrize("model", GPU_MODELS)
def test_kind_gpu_without_a_gpu_warns_at_load(
    honoured: tuple[RunningServer, list[logging.LogRecord]], model: str
) -> None:
    warnings = [r.getMessage() for r in honoured[1] if r.levelno == logging.WARNING]
    assert any(model in w and "KIND_GPU" in w and "CPU" in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("model", "backend", "provider"),
    [
        ("onnx_gpu", "onnxruntime", "CPUExecutionProvider"),
        ("torch_gpu", "pytorch", "torch"),
        ("python_gpu", "python", "python"),
    ],
)
def test_the_metrics_device_label_says_cpu(
    honoured: tuple[RunningServer, list[logging.LogRecord]],
    model: str,
    backend: str,
    provider: str,
) -> None:
    labels = {"model": model, "version": "1", "backend": backend, "provider": provider}
    samples = scrape(honoured[0])
    assert value(samples, "inferd_model_info", **labels, device="cpu") == 1
    assert value(samples, "inferd_model_info", **labels, device="cuda:0") == 0


def test_a_python_model_learns_its_kind_and_instance_name(client: Client) -> None:
    x = np.zeros(1, dtype=np.float32)
    info = client.infer("python_gpu", {"IN": (x, "FP32")}).as_numpy("INFO")
    assert info.tolist() == [b"CPU wants_gpu_0"]


@pytest.mark.parametrize(("model", "path"), [(m, p) for m, _, p in REFUSED])
def test_a_refused_field_leaves_the_model_unavailable_naming_it(
    client: Client, model: str, path: str
) -> None:
    if client.protocol == "http":
        rows = client.raw.get_model_repository_index()
    else:
        rows = client.raw.get_model_repository_index(as_json=True)["models"]
    (row,) = [r for r in rows if r["name"] == model]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"].startswith(f"{model}/config.pbtxt: {path}: "), row
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, {"x": (np.zeros((1, 4), np.float32), "FP32")})
    assert f"{model}/config.pbtxt: {path}" in str(info.value)
    # The others keep serving.
    result = client.infer("onnx_gpu", {"x": (np.zeros((1, 4), np.float32), "FP32")})
    np.testing.assert_array_equal(result.as_numpy("y"), np.ones((1, 4), np.float32))


def test_a_load_request_with_a_refused_field_is_a_400_naming_it(client: Client) -> None:
    config = json.dumps(
        {
            "name": "onnx_gpu",
            "platform": "onnxruntime_onnx",
            "max_batch_size": 8,
            "metric_tags": {"team": "a"},
        }
    )
    with pytest.raises(InferenceServerException) as info:
        client.raw.load_model("onnx_gpu", config=config)
    assert "onnx_gpu/config.pbtxt: metric_tags: " in str(info.value)
    expected = "400" if client.protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert str(info.value.status()) == expected
    assert client.raw.is_model_ready("onnx_gpu")  # the loaded version keeps serving
