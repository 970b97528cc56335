"""The ONNX Runtime backend honours Triton's parameters and never falls back silently."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.backends.onnx import OnnxBackend, OnnxInstance
from inferd.config.model_config import ConfigError
from tests.support.models import builders


def _load(tmp_path: Path, extra: str, instance_count: int = 1) -> OnnxInstance:
    builders._save(
        builders.identity(TensorProto.FLOAT, ["batch", 3]), tmp_path / "1" / "model.onnx"
    )
    config = mc.ModelConfig()
    text_format.Parse(
        textwrap.dedent(
            """
            name: "m"
            platform: "onnxruntime_onnx"
            max_batch_size: 4
            """
        )
        + extra,
        config,
    )
    OnnxBackend().complete_config(config, tmp_path / "1")
    ctx = LoadContext("m", "1", tmp_path / "1", config, 0, instance_count)
    return OnnxBackend().load(ctx)


def _options(instance: OnnxInstance) -> ort.SessionOptions:
    return instance._session.get_session_options()


def test_triton_parameters_reach_the_session(tmp_path: Path) -> None:
    instance = _load(
        tmp_path,
        """
        parameters { key: "intra_op_thread_count" value: { string_value: "3" } }
        parameters { key: "inter_op_thread_count" value: { string_value: "2" } }
        parameters { key: "execution_mode" value: { string_value: "1" } }
        optimization { graph { level: -1 } }
        """,
    )
    options = _options(instance)
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def test_default_threads_split_the_cores_between_instances(tmp_path: Path) -> None:
    import os

    instance = _load(tmp_path, "", instance_count=2)
    assert _options(instance).intra_op_num_threads == max(1, (os.cpu_count() or 1) // 2)
    assert _options(instance).graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            'parameters { key: "execution_mode" value: { string_value: "5" } }',
            ["execution_mode", "5"],
        ),
        (
            'parameters { key: "intra_op_thread_count" value: { string_value: "many" } }',
            ["intra_op_thread_count", "many"],
        ),
    ],
)
def test_bad_parameters_name_the_field(tmp_path: Path, extra: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, extra)
    for word in words:
        assert word in str(info.value)
    assert "m/config.pbtxt" in str(info.value)


def test_gpu_kind_without_cuda_warns_and_reports_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA: the fallback path does not apply")
    with caplog.at_level(logging.WARNING, logger="inferd.backends.onnx"):
        instance = _load(tmp_path, "instance_group [ { count: 1, kind: KIND_GPU } ]")
    assert instance.device == "cpu"
    assert instance.providers == ["CPUExecutionProvider"]
    assert any("KIND_GPU" in r.getMessage() and "CPU" in r.getMessage() for r in caplog.records)


def test_cpu_kind_never_asks_for_cuda(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="inferd.backends.onnx"):
        instance = _load(tmp_path, "instance_group [ { count: 1, kind: KIND_CPU } ]")
    assert instance.device == "cpu"
    assert not caplog.records
