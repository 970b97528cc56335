"""Drive the load level by level: warm up, measure windows until stable (or for a fixed
duration), and read the server's statistics around the measurement."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd_tools.bench import inputs
from inferd_tools.bench.api import ServerApi
from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.load import (
    Load,
    LocalSource,
    ProcessSource,
    Source,
    Target,
    drain,
    merge,
    split_load,
)
from inferd_tools.bench.stats import (
    Samples,
    WindowStats,
    is_stable,
    latency_summary,
    server_split,
    stats_totals,
    window,
)


def parse_levels(text: str, kind: type[int] | type[float] = int) -> list[float]:
    """'1,8,64' -> [1, 8, 64]; 'A:B:xF' -> A, A*F, ... up to B; 'A:B[:S]' -> A, A+S, ...
    up to B (perf_analyzer's start:end:step)."""
    try:
        if ":" not in text:
            values = [kind(v) for v in text.split(",") if v.strip()]
        else:
            parts = text.split(":")
            if len(parts) not in (2, 3):
                raise ValueError
            start, end = kind(parts[0]), kind(parts[1])
            step = parts[2] if len(parts) == 3 else "1"
            values = []
            if step.startswith("x"):
                factor = float(step[1:])
                if factor <= 1:
                    raise ValueError
                v: float = start
                while v <= end * (1 + 1e-9):
                    values.append(kind(v))
                    v *= factor
            else:
                inc = kind(step)
                if inc <= 0:
                    raise ValueError
                v = start
                while v <= end * (1 + 1e-9):
                    values.append(kind(v))
                    v += inc
        if not values or any(v <= 0 or math.isnan(v) for v in values):
            raise ValueError
    except ValueError:
        raise BenchError(
            f"{text!r}: expected a list (1,8,64), a range start:end:step (1:16:4) or a "
            "geometric range start:end:xFACTOR (1:64:x2), of positive numbers"
        ) from None
    return [float(v) for v in values]


@dataclass
class BenchConfig:
    url: str = "127.0.0.1:8000"
    protocol: str = "http"
    model: str = ""
    version: str = ""
    http_binary: bool = False
    input_data: str = "random"
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batch_size: int = 1
    concurrency: list[int] = field(default_factory=lambda: [1])
    request_rates: list[float] = field(default_factory=list)
    poisson: bool = False
    warmup_s: float = 2.0
    window_s: float = 5.0
    stability_percentage: float = 10.0
    max_windows: int = 10
    duration_s: float | None = None
    processes: int = 1
    max_connections: int = 256
    timeout_s: float = 60.0
    stats_url: str | None = None
    # The model whose statistics the server-side figures are of (default: `model`): tune
    # measures through one model (an ensemble) while tuning another (one of its steps).
    stats_model: str = ""
    seed: int = 0

    @property
    def address(self) -> str:
        """http://host:port for HTTP, host:port for gRPC."""
        url = self.url.rstrip("/")
        if self.protocol == "grpc":
            return url.split("://", 1)[-1]
        return url if "://" in url else f"http://{url}"

    @property
    def encoding(self) -> str:
        if self.protocol == "grpc":
            return "raw"
        return "binary" if self.http_binary else "json"

    def validate(self) -> None:
        if self.protocol not in ("http", "grpc"):
            raise BenchError(f"--protocol {self.protocol!r}: expected http or grpc")
        if not self.model:
            raise BenchError("give the model to load with -m/--model")
        if self.processes < 1:
            raise BenchError("--processes must be at least 1")
        if self.batch_size < 1:
            raise BenchError("--batch-size must be at least 1")
        if self.window_s <= 0 or (self.duration_s is not None and self.duration_s <= 0):
            raise BenchError("--window-s and --duration-s must be positive")
        if self.max_windows < 3 and self.duration_s is None:
            raise BenchError("--max-windows must be at least 3 (stability needs 3 windows)")
        if self.warmup_s < 0:
            raise BenchError("--warmup-s must not be negative")
        if self.max_connections < 1:
            raise BenchError("--max-connections must be at least 1")


@dataclass
class LevelResult:
    mode: str  # "concurrency" or "request_rate"
    value: float
    windows: int
    # perf_analyzer's criterion met (True) or not (False); None: not checked (--duration-s).
    stable: bool | None
    duration_s: float
    throughput: float  # successful requests per second (infer/s = this * batch size)
    sent: int
    completed: int
    successes: int
    errors: dict[str, int]
    latency_ms: dict[str, float]
    server: dict[str, float] | None
    window_throughputs: list[float] = field(default_factory=list)
    # A sample of the failed requests' messages ('<outcome>: <message>' -> count): see Samples.
    error_messages: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "value": self.value,
            "windows": self.windows,
            "stable": self.stable,
            "duration_s": self.duration_s,
            "throughput": self.throughput,
            "sent": self.sent,
            "completed": self.completed,
            "successes": self.successes,
            "errors": dict(self.errors),
            "latency_ms": dict(self.latency_ms),
            "server": None if self.server is None else dict(self.server),
            "window_throughputs": list(self.window_throughputs),
        }


@dataclass
class BenchResult:
    config: BenchConfig
    levels: list[LevelResult]
    cores: int  # CPU cores the machine has
    processes: int  # worker processes used (1: the load runs in the main process)
    inputs: list[dict[str, Any]]  # the first request's
    server_stats: bool  # whether the server answered the statistics API
    # Distinct requests sent in turn (one per entry of a perf_analyzer --input-data file).
    requests: int = 1
    # Stopped (Ctrl-C) before every level was measured: `levels` holds the finished ones.
    interrupted: bool = False


ProgressFn = Callable[[str], None]


def _noop(_: str) -> None:
    pass


async def _prepare(config: BenchConfig) -> tuple[Target, list[list[inputs.Tensor]], bool]:
    async with ServerApi(config.protocol, config.address, config.model, config.version) as api:
        metadata = await api.metadata()
        max_batch = await api.max_batch_size()
    specs = inputs.specs_from_metadata(metadata)
    requests = inputs.make_requests(
        specs, max_batch, config.batch_size, config.shapes, config.input_data, seed=config.seed
    )
    bodies, headers = [], []
    for tensors in requests:
        head: dict[str, str] = {}
        if config.protocol == "grpc":
            body = inputs.grpc_body(config.model, config.version, tensors)
        elif config.http_binary:
            body, head = inputs.http_binary_body(tensors)
        else:
            body, head = inputs.http_json_body(tensors)
        bodies.append(body)
        headers.append(head)
    target = Target(
        protocol=config.protocol,
        address=config.address,
        model=config.model,
        version=config.version,
        bodies=tuple(bodies),
        headers=tuple(headers),
        timeout_s=config.timeout_s,
        max_connections=config.max_connections,
    )
    return target, requests, max_batch is not None


def _stats_api(config: BenchConfig) -> ServerApi:
    model, version = config.model, config.version
    if config.stats_model:
        model, version = config.stats_model, ""
    if config.stats_url:
        url = config.stats_url.rstrip("/")
        return ServerApi("http", url if "://" in url else f"http://{url}", model, version)
    return ServerApi(config.protocol, config.address, model, version)


class BenchRun:
    """One run of the bench. `result` fills in as it goes (None until the inputs are built,
    then one level more each time a level is measured), so a caller whose run was
    interrupted (Ctrl-C cancels the task) can still report what was measured."""

    def __init__(self, config: BenchConfig, progress: ProgressFn = _noop) -> None:
        self.config = config
        self.progress = progress
        self.result: BenchResult | None = None

    async def execute(self) -> BenchResult:
        config = self.config
        config.validate()
        target, requests, _ = await _prepare(config)
        workers = config.processes
        sources: list[Source]
        if workers == 1:
            sources = [LocalSource(target)]
        else:
            sources = [ProcessSource(target) for _ in range(workers)]
        levels = [("concurrency", float(c)) for c in config.concurrency]
        if config.request_rates:
            levels = [("request_rate", r) for r in config.request_rates]
        async with _stats_api(config) as stats_api:
            has_stats = await stats_api.statistics() is not None
            result = BenchResult(
                config=config,
                levels=[],
                cores=os.cpu_count() or 1,
                processes=workers,
                inputs=[
                    {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                    for t in requests[0]
                ],
                requests=len(requests),
                server_stats=has_stats,
                interrupted=True,  # until the last level is in
            )
            self.result = result
            try:
                await asyncio.gather(*(s.open() for s in sources))
                for mode, value in levels:
                    result.levels.append(
                        await _run_level(
                            config, sources, stats_api, has_stats, mode, value, self.progress
                        )
                    )
            finally:
                await asyncio.gather(*(s.close() for s in sources), return_exceptions=True)
        result.interrupted = False
        return result


async def run(config: BenchConfig, progress: ProgressFn = _noop) -> BenchResult:
    return await BenchRun(config, progress).execute()


async def _drain_all(sources: Sequence[Source]) -> Samples:
    return merge(list(await asyncio.gather(*(drain(s) for s in sources))))


async def _run_level(
    config: BenchConfig,
    sources: Sequence[Source],
    stats_api: ServerApi,
    has_stats: bool,
    mode: str,
    value: float,
    progress: ProgressFn,
) -> LevelResult:
    label = f"concurrency {value:g}" if mode == "concurrency" else f"rate {value:g}/s"
    if mode == "concurrency":
        load = Load(concurrency=int(value), seed=config.seed)
    else:
        load = Load(rate=value, poisson=config.poisson, seed=config.seed)
    n = len(sources)
    await asyncio.gather(*(s.start(split_load(load, i, n)) for i, s in enumerate(sources)))
    try:
        if config.warmup_s > 0:
            progress(f"{label}: warming up for {config.warmup_s:g} s")
            await asyncio.sleep(config.warmup_s)
        await _drain_all(sources)

        async def snapshot() -> dict[str, int] | None:
            if not has_stats:
                return None
            stats = await stats_api.statistics()
            return None if stats is None else stats_totals(stats)

        snapshots = [await snapshot()]
        windows: list[WindowStats] = []
        window_s = config.duration_s if config.duration_s is not None else config.window_s
        max_windows = 1 if config.duration_s is not None else config.max_windows
        started = time.perf_counter()
        while True:
            await asyncio.sleep(max(0.0, started + window_s - time.perf_counter()))
            samples = await _drain_all(sources)
            ended = time.perf_counter()
            windows.append(window(ended - started, samples))
            started = ended
            snapshots.append(await snapshot())
            w = windows[-1]
            errors = sum(w.samples.errors.values())
            progress(
                f"{label}: window {len(windows)}: {w.throughput:,.0f} req/s, "
                f"p50 {w.latency_s['p50'] * 1e3:.2f} ms, p99 {w.p99 * 1e3:.2f} ms, "
                f"{errors} errors"
            )
            if config.duration_s is not None or len(windows) >= max_windows:
                break
            if is_stable(windows, config.stability_percentage):
                break
    finally:
        await asyncio.gather(*(s.stop() for s in sources))

    stable = (
        None if config.duration_s is not None else is_stable(windows, config.stability_percentage)
    )
    used = windows[-3:] if config.duration_s is None else windows
    merged = Samples()
    for w in used:
        merged.extend(w.samples)
    duration = sum(w.duration_s for w in used)
    before, after = snapshots[-len(used) - 1], snapshots[-1]
    server = None if before is None or after is None else server_split(before, after)
    return LevelResult(
        mode=mode,
        value=value,
        windows=len(windows),
        stable=stable,
        duration_s=duration,
        throughput=merged.successes / duration if duration > 0 else 0.0,
        sent=merged.sent,
        completed=merged.completed,
        successes=merged.successes,
        errors=merged.errors,
        latency_ms={k: v * 1e3 for k, v in latency_summary(merged.latencies).items()},
        server=server,
        window_throughputs=[w.throughput for w in windows],
        error_messages=dict(merged.error_messages),
    )


def progress_printer(enabled: bool) -> ProgressFn:
    """A live line on stderr, rewritten in place with a carriage return."""
    if not enabled:
        return _noop

    def show(line: str) -> None:
        sys.stderr.write("\r\x1b[2K" + line if sys.stderr.isatty() else "\r" + line.ljust(100))
        sys.stderr.flush()

    return show
