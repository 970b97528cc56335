"""Triton's host series from /proc (a proc directory the test writes) and from NVML."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.metrics.host_families import CpuCollector, GpuCollector


def _write_proc(proc: Path, busy: tuple[int, ...], idle: int, iowait: int) -> None:
    user, nice, system, irq, softirq, steal = busy
    proc.mkdir(exist_ok=True)
    (proc / "stat").write_text(
        f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\n"
        f"cpu0 {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\n"
    )
    (proc / "meminfo").write_text(
        "MemTotal:        1000 kB\nMemFree:          100 kB\nMemAvailable:     250 kB\n"
    )


def _samples(collector: CpuCollector) -> dict[str, tuple[str, float]]:
    return {f.name: (f.type, f.samples[0].value) for f in collector.collect()}


def test_cpu_utilization_is_the_busy_share_since_the_last_reading(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _write_proc(proc, (100, 0, 50, 0, 0, 0), idle=800, iowait=50)
    collector = CpuCollector(proc, min_interval_s=0)
    # +30 busy (user 20, system 5, irq 2, softirq 2, steal 1), +70 idle (60 idle, 10 iowait)
    _write_proc(proc, (120, 0, 55, 2, 2, 1), idle=860, iowait=60)
    samples = _samples(collector)
    assert samples["nv_cpu_utilization"] == ("gauge", pytest.approx(0.3))  # type: ignore[comparison-overlap]
    assert samples["nv_cpu_memory_total_bytes"] == ("gauge", 1000 * 1024)
    assert samples["nv_cpu_memory_used_bytes"] == ("gauge", 750 * 1024)  # total - available
    # No tick since: the last figure stays (no division by zero, no jump to 0).
    assert _samples(collector)["nv_cpu_utilization"][1] == pytest.approx(0.3)


def test_close_scrapes_share_one_reading(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _write_proc(proc, (100, 0, 0, 0, 0, 0), idle=100, iowait=0)
    collector = CpuCollector(proc, min_interval_s=3600)
    _write_proc(proc, (150, 0, 0, 0, 0, 0), idle=150, iowait=0)
    assert collector.utilization() == pytest.approx(0.5)  # the first figure is measured
    _write_proc(proc, (150, 0, 0, 0, 0, 0), idle=250, iowait=0)
    assert collector.utilization() == pytest.approx(0.5)  # within the interval: the same


def test_no_proc_means_no_cpu_series(tmp_path: Path) -> None:
    assert list(CpuCollector(tmp_path / "absent").collect()) == []
    proc = tmp_path / "garbled"
    proc.mkdir()
    (proc / "stat").write_text("intr 1 2 3\n")
    (proc / "meminfo").write_text("MemTotal: lots\n")
    assert list(CpuCollector(proc).collect()) == []


def test_gpu_series_follow_what_nvml_lists() -> None:
    """Here: no GPU (or no driver), so no series and no error. On a GPU host: one sample of
    each series per GPU NVML lists, labelled with its UUID."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        uuids = {
            str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        }
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        uuids = set()
    collector = GpuCollector()
    try:
        families = {f.name: f for f in collector.collect()}
    finally:
        collector.close()
    if not uuids:
        assert families == {}
        return
    assert {s.labels["gpu_uuid"] for s in families["nv_gpu_utilization"].samples} == uuids
    for sample in families["nv_gpu_memory_total_bytes"].samples:
        assert sample.value > 0
