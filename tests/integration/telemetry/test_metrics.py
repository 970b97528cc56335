"""Metrics and statistics move by exactly what a scripted sequence of requests should cause."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.support.metrics_scrape import scrape, value
from tests.support.servers import RunningServer, run_server


def _body(rows: int, datatype: str = "FP32") -> dict[str, object]:
    return {
        "inputs": [
            {"name": "IN", "datatype": datatype, "shape": [rows, 2], "data": [1] * (2 * rows)}
        ]
    }


@pytest.fixture(scope="module")
def scripted(mixed_repository: Path) -> Iterator[tuple[RunningServer, dict, dict]]:  # type: ignore[type-arg]
    """A fresh server, its metrics before, and after a scripted sequence of requests."""
    with run_server(mixed_repository, metrics_triton_names=True) as running:
        before = scrape(running)
        with running.client() as c:
            for _ in range(3):
                assert c.post("/v2/models/counter/infer", json=_body(1)).status_code == 200
            assert c.post("/v2/models/counter/infer", json=_body(4)).status_code == 200
            for _ in range(2):
                assert c.post("/v2/models/counter/infer", json=_body(1, "FP64")).status_code == 400
            assert c.post("/v2/models/counter/infer", content=b"{not json").status_code == 400
            assert c.post("/v2/models/nope/infer", json=_body(1)).status_code == 404
            assert c.post("/v2/models/counter/versions/9/infer", json=_body(1)).status_code == 404
            bad = {
                "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [-1] * 4}]
            }
            assert c.post("/v2/models/faulty/infer", json=bad).status_code == 500
            assert c.post("/v2/models/load_fails/infer", json=_body(1)).status_code == 503
        _cancel_one_over_grpc(running)
        after = scrape(running)
        yield running, before, after


def _cancel_one_over_grpc(running: RunningServer) -> None:
    """gRPC calls whose deadline passes while the model runs (counted as timeouts) and that
    the client cancels (counted as cancelled). A call cancelled before the server even saw
    it counts nothing, so each kind is tried until the server has counted one."""
    channel = grpc.insecure_channel(running.grpc_address)
    grpc.channel_ready_future(channel).result(timeout=30)  # no connecting inside a deadline
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = pb.ModelInferRequest(model_name="slow_counter")
    req.inputs.add(name="IN", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    labels = {"model": "slow_counter", "version": "1"}

    def counted(reason: str) -> bool:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # the server notices a little later
            if value(scrape(running), "inferd_request_failure_total", **labels, reason=reason):
                return True
            time.sleep(0.05)
        return False

    for _ in range(5):
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(req, timeout=0.015)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        if counted("timeout"):
            break
    for _ in range(5):
        call = stub.ModelInfer.future(req)
        time.sleep(0.015)
        call.cancel()
        if counted("cancelled"):
            break
    channel.close()


def delta(scripted, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    _, before, after = scripted
    return value(after, name, **labels) - value(before, name, **labels)


def test_success_and_row_counters(scripted) -> None:  # type: ignore[no-untyped-def]
    counter = {"model": "counter", "version": "1"}
    assert delta(scripted, "inferd_request_success_total", **counter) == 4
    assert delta(scripted, "inferd_inference_count_total", **counter) == 7
    assert delta(scripted, "inferd_execution_count_total", **counter) == 4
    assert delta(scripted, "inferd_request_duration_seconds_count", **counter) == 4
    assert delta(scripted, "inferd_queue_duration_seconds_count", **counter) == 4
    assert delta(scripted, "inferd_compute_infer_duration_seconds_count", **counter) == 4
    assert delta(scripted, "inferd_batch_size_count", **counter) == 4
    assert delta(scripted, "inferd_batch_size_sum", **counter) == 7
    assert delta(scripted, "inferd_batch_size_bucket", **counter, le="1.0") == 3
    assert delta(scripted, "inferd_batch_close_total", **counter, reason="queue_empty") == 4


def test_failures_by_reason(scripted) -> None:  # type: ignore[no-untyped-def]
    failure = "inferd_request_failure_total"
    assert delta(scripted, failure, model="counter", version="1", reason="invalid_input") == 3
    # Unknown names never become label values: both land on the empty model label.
    assert delta(scripted, failure, model="", version="", reason="not_found") == 1
    assert delta(scripted, failure, model="counter", version="", reason="not_found") == 1
    assert delta(scripted, failure, model="faulty", version="1", reason="model_error") == 1
    assert delta(scripted, failure, model="load_fails", version="", reason="unavailable") == 1
    assert delta(scripted, failure, model="slow_counter", version="1", reason="cancelled") >= 1
    assert delta(scripted, failure, model="slow_counter", version="1", reason="timeout") >= 1
    # A failed batch is not an execution that produced anything, but its close is counted.
    assert delta(scripted, "inferd_execution_count_total", model="faulty", version="1") == 0
    assert (
        delta(
            scripted, "inferd_batch_close_total", model="faulty", version="1", reason="queue_empty"
        )
        == 1
    )


def test_state_gauges(scripted) -> None:  # type: ignore[no-untyped-def]
    _, _, after = scripted
    assert value(after, "inferd_model_state", model="mlp", version="2", state="READY") == 1
    assert (
        value(after, "inferd_model_state", model="load_fails", version="1", state="UNAVAILABLE")
        == 1
    )
    assert value(after, "inferd_model_state", model="load_fails", version="1", state="READY") == 0
    assert value(after, "inferd_queue_depth", model="counter", version="1") == 0
    assert (
        value(
            after,
            "inferd_model_info",
            model="mlp",
            version="2",
            backend="onnxruntime",
            device="cpu",
            provider="CPUExecutionProvider",
        )
        == 1
    )
    assert (
        value(
            after,
            "inferd_model_info",
            model="counter",
            version="1",
            backend="python",
            device="cpu",
            provider="python",
        )
        == 1
    )
    assert value(after, "inferd_model_load_duration_seconds", model="mlp", version="2") > 0
    assert 0 < value(after, "inferd_health_score", model="counter", version="1") <= 1
    assert value(after, "process_resident_memory_bytes") > 0


def test_triton_names(scripted) -> None:  # type: ignore[no-untyped-def]
    # Counters parse as counters, so the parser names their samples `_total` (the wire
    # keeps Triton's bare names: test_triton_wire_format).
    counter = {"model": "counter", "version": "1"}
    assert delta(scripted, "nv_inference_request_success_total", **counter) == 4
    assert delta(scripted, "nv_inference_count_total", **counter) == 7
    assert delta(scripted, "nv_inference_exec_count_total", **counter) == 4
    assert delta(scripted, "nv_inference_request_duration_us_total", **counter) > 0
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        key = (f"nv_inference_{name}_duration_us_total", frozenset(counter.items()))
        assert key in scripted[2]
    assert ("nv_inference_pending_request_count", frozenset(counter.items())) in scripted[2]


def test_triton_failures_by_triton_reason(scripted) -> None:  # type: ignore[no-untyped-def]
    failure = "nv_inference_request_failure_total"
    # inferd's invalid_input -> OTHER; model_error -> BACKEND; cancelled -> CANCELED;
    # timeout (and rejected) -> REJECTED. Requests no version accepted count nowhere.
    assert delta(scripted, failure, model="counter", version="1", reason="OTHER") == 3
    assert delta(scripted, failure, model="faulty", version="1", reason="BACKEND") == 1
    assert delta(scripted, failure, model="slow_counter", version="1", reason="CANCELED") >= 1
    assert delta(scripted, failure, model="slow_counter", version="1", reason="REJECTED") >= 1
    _, _, after = scripted
    # Every version carries all four reasons, as Triton's do from load on.
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        labels = {"model": "mlp", "version": "2", "reason": reason}
        assert (failure, frozenset(labels.items())) in after
        assert value(after, failure, **labels) == 0
    # Split by reason, they add up to the statistics' failures.
    total = sum(
        value(after, failure, model="counter", version="1", reason=r)
        for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    )
    with scripted[0].client() as c:
        stats = c.get("/v2/models/counter/versions/1/stats").json()["model_stats"][0]
    assert total == stats["inference_stats"]["fail"]["count"]


def test_triton_wire_format(scripted) -> None:  # type: ignore[no-untyped-def]
    """Triton's exposition: counters typed as counters under their bare names, the host's
    gauges beside them."""
    running = scripted[0]
    response = httpx.get(running.metrics_url)
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.text
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name in (
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
    ):  # fmt: skip
        assert families[name] == "counter", name
        assert f"# TYPE {name} counter\n" in text
        if name != "nv_inference_request_failure":  # that one also carries a reason
            assert f'\n{name}{{model="counter",version="1"}} ' in text
    assert '\nnv_inference_request_failure{model="faulty",reason="BACKEND",version="1"} 1.0' in text
    for name in (
        "nv_inference_pending_request_count",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    ):
        assert families[name] == "gauge", name
    # inferd's own counters keep prometheus_client's `_total`.
    assert "# TYPE inferd_request_success_total counter\n" in text


def test_host_metrics(scripted) -> None:  # type: ignore[no-untyped-def]
    _, _, after = scripted
    assert 0 <= value(after, "nv_cpu_utilization") <= 1
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert value(after, "nv_cpu_memory_total_bytes") == total
    assert 0 < value(after, "nv_cpu_memory_used_bytes") <= total
    # GPU series exactly for the GPUs NVML lists: none on a machine without one (or without
    # its driver), and never a failed scrape for it.
    gpus = [labels for name, labels in after if name == "nv_gpu_utilization"]
    assert len(gpus) == _nvml_gpu_count()
    for name in ("nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes", "nv_gpu_power_usage"):
        assert len([1 for n, _ in after if n == name]) <= len(gpus)


def _nvml_gpu_count() -> int:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def test_statistics_in_triton_shape(scripted) -> None:  # type: ignore[no-untyped-def]
    running = scripted[0]
    with running.client() as c:
        doc = c.get("/v2/models/counter/versions/1/stats").json()
        everything = c.get("/v2/models/stats").json()
        assert c.get("/v2/models/nope/stats").status_code == 404
    (stats,) = doc["model_stats"]
    assert set(stats) == {
        "name", "version", "last_inference", "inference_count", "execution_count",
        "inference_stats", "response_stats", "batch_stats", "memory_usage",
    }  # fmt: skip
    assert set(stats["inference_stats"]) == {
        "success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
        "cache_hit", "cache_miss",
    }  # fmt: skip
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["inference_stats"]["fail"]["count"] == 3
    assert stats["inference_count"] == 7
    assert stats["execution_count"] == 4
    assert stats["last_inference"] > 0
    by_size = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert by_size == {1: 3, 4: 1}
    names = {(s["name"], s["version"]) for s in everything["model_stats"]}
    assert {("counter", "1"), ("mlp", "1"), ("mlp", "2")} <= names


def test_statistics_over_grpc_match_http(scripted) -> None:  # type: ignore[no-untyped-def]
    running = scripted[0]
    channel = grpc.insecure_channel(running.grpc_address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    response = stub.ModelStatistics(pb.ModelStatisticsRequest(name="counter", version="1"))
    channel.close()
    (stats,) = response.model_stats
    assert stats.inference_stats.success.count == 4
    assert stats.inference_count == 7
    assert {b.batch_size for b in stats.batch_stats} == {1, 4}


def test_metrics_can_be_turned_off(good_repository: Path) -> None:
    with run_server(good_repository, metrics_port=None) as running:
        assert running.server.metrics_server is None
        assert running.server.metrics is None
