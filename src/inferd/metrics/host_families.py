"""The host's CPU, memory and GPUs under Triton's names (with `--metrics-triton-names`).

`nv_cpu_*` come from /proc, as Triton's do (Linux only); `nv_gpu_*` from NVML, through the
optional `gpu` extra (nvidia-ml-py), for every GPU NVML sees, labelled `gpu_uuid`. No /proc,
no NVML library, no driver or no GPU: those series are absent, never a failed scrape. They
are read at scrape time, where Triton polls every 2 s. docs/metrics.md lists them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("inferd.metrics")

# Scrapes closer together than this share one utilization figure: several scrapers (a
# Prometheus, perf_analyzer's 1 s polls) would otherwise each measure a sliver of time.
CPU_MIN_INTERVAL_S = 1.0
PROC = Path("/proc")


def cpu_times(proc: Path) -> tuple[int, int] | None:
    """(busy, idle) jiffies of all cores since boot, from /proc/stat's first line; Triton's
    split: busy is user, nice, system, irq, softirq and steal; idle is idle and iowait."""
    try:
        with (proc / "stat").open() as f:
            first = f.readline().split()
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, first[1:9])
    except (OSError, ValueError):
        return None
    if first[0] != "cpu":
        return None
    return user + nice + system + irq + softirq + steal, idle + iowait


def memory_bytes(proc: Path) -> tuple[int, int] | None:
    """(total, used) RAM: used is MemTotal − MemAvailable, as Triton counts it."""
    values: dict[str, int] = {}
    try:
        with (proc / "meminfo").open() as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) * 1024  # the file says kB: KiB
        total, available = values["MemTotal"], values["MemAvailable"]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return total, max(0, total - available)


class CpuCollector(Collector):
    """nv_cpu_utilization (0..1, all cores, since the previous reading) and RAM."""

    def __init__(self, proc: Path = PROC, min_interval_s: float = CPU_MIN_INTERVAL_S) -> None:
        self._proc = proc
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()  # scrapes run on threads of their own, maybe at once
        self._last = cpu_times(proc)
        self._last_at = time.monotonic()
        self._utilization: float | None = None

    def utilization(self) -> float | None:
        """Busy share of the jiffies since the previous reading; None without /proc/stat."""
        with self._lock:
            if self._last is None:
                return None
            now = time.monotonic()
            if self._utilization is None or now - self._last_at >= self._min_interval_s:
                times = cpu_times(self._proc)
                if times is None:
                    return None
                busy, idle = (max(0, n - o) for n, o in zip(times, self._last, strict=True))
                if busy + idle:  # no tick since the last reading: keep the last figure
                    self._utilization = busy / (busy + idle)
                    self._last, self._last_at = times, now
            # 0 until a first tick is measured, as Triton's before its first poll.
            return self._utilization if self._utilization is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        utilization = self.utilization()
        if utilization is not None:
            yield GaugeMetricFamily(
                "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", utilization
            )
        memory = memory_bytes(self._proc)
        if memory is not None:
            total, used = memory
            yield GaugeMetricFamily(
                "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", total
            )
            yield GaugeMetricFamily(
                "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", used
            )


GPU_SERIES = {  # name -> help, as Triton's
    "nv_gpu_utilization": "GPU utilization rate [0.0 - 1.0)",
    "nv_gpu_memory_total_bytes": "GPU total memory, in bytes",
    "nv_gpu_memory_used_bytes": "GPU used memory, in bytes",
    "nv_gpu_power_usage": "GPU power usage in watts",
}


def _nvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")  # the optional `gpu` extra: nvidia-ml-py
    except ImportError:
        return None


class GpuCollector(Collector):
    """nv_gpu_utilization, nv_gpu_memory_{used,total}_bytes, nv_gpu_power_usage per GPU."""

    def __init__(self) -> None:
        self._nvml = _nvml()
        self._gpus: list[tuple[str, Any]] = []  # (uuid, NVML handle)
        if self._nvml is None:
            log.debug("no GPU metrics: nvidia-ml-py is not installed (the `gpu` extra)")
            return
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.debug("no GPU metrics: NVML: %s", exc)
            self._nvml = None
            return
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                self._gpus.append((uuid.decode() if isinstance(uuid, bytes) else uuid, handle))
        except nvml.NVMLError as exc:
            log.warning("GPU metrics: NVML could not list the GPUs: %s", exc)
        log.info("GPU metrics for %d GPU(s)", len(self._gpus))

    def _sample(self, handle: Any) -> dict[str, float]:
        """One GPU's readings; a reading this GPU does not report (e.g. its power) is left
        out rather than failing the others."""
        nvml = self._nvml
        assert nvml is not None
        sample: dict[str, float] = {}
        with contextlib.suppress(nvml.NVMLError):
            sample["nv_gpu_utilization"] = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
        with contextlib.suppress(nvml.NVMLError):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            sample["nv_gpu_memory_used_bytes"] = float(memory.used)
            sample["nv_gpu_memory_total_bytes"] = float(memory.total)
        with contextlib.suppress(nvml.NVMLError):
            sample["nv_gpu_power_usage"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000  # mW
        return sample

    def collect(self) -> Iterator[Metric]:
        if self._nvml is None or not self._gpus:
            return
        families = {
            name: GaugeMetricFamily(name, doc, labels=("gpu_uuid",))
            for name, doc in GPU_SERIES.items()
        }
        for uuid, handle in self._gpus:
            for name, value in self._sample(handle).items():
                families[name].add_metric([uuid], value)
        yield from families.values()

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.debug("NVML shutdown: %s", exc)
            self._nvml = None


def register_host_metrics(registry: CollectorRegistry) -> GpuCollector:
    """Triton's host series (nv_cpu_*, nv_gpu_*) in `registry`; close the GpuCollector it
    returns when done."""
    gpus = GpuCollector()
    registry.register(CpuCollector())
    registry.register(gpus)
    return gpus
