"""The sweep itself: the repository API calls, one bench run per candidate, and the table."""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.public import ADMIN_TOKEN_ENV
from inferd_tools.bench.api import ServerApi
from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.runner import BenchConfig, LevelResult, run
from inferd_tools.tune.candidates import Axes, Candidate, candidate_config, check_axes, grid
from inferd_tools.tune.errors import TuneError
from inferd_tools.tune.repository_api import RepositoryApi

CHECKSUM_PARAMETER = "model_checksum"

OUT_OF_MEMORY = "out of memory"

# What runtimes say when memory runs out, lowercased; a load error or a failed request's
# message containing any of them means the candidate ran out of memory. The server passes
# the exception's message on but not always its type, hence messages, not exception names.
OUT_OF_MEMORY_PATTERNS: tuple[str, ...] = (
    "out of memory",  # CUDA ("CUDA out of memory", "CUDA error: out of memory"), ROCm, MPS
    "outofmemory",  # java.lang.OutOfMemoryError, hipErrorOutOfMemory
    "failed to allocate memory",  # onnxruntime's arenas
    "bad_alloc",  # C++ std::bad_alloc, as a native backend reports it
    "memoryerror",  # Python's MemoryError, when the type name is passed on
    "unable to allocate",  # numpy's MemoryError ("Unable to allocate 3.7 GiB for an array")
    "can't allocate memory",  # torch's CPU allocator
    "cannot allocate memory",  # ENOMEM's text
    "alloc_failed",  # cuBLAS / cuDNN: CUBLAS_STATUS_ALLOC_FAILED
    "cudaerrormemoryallocation",
)


def is_out_of_memory(message: str) -> bool:
    lowered = message.lower()
    return any(pattern in lowered for pattern in OUT_OF_MEMORY_PATTERNS)


@dataclass
class Outcome:
    candidate: Candidate
    status: str  # "ok", "load failed", "bench errors", "out of memory", "skipped"
    detail: str = ""
    throughput: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    # The tuned model's own statistics over the measurement: rows per execution, and the
    # share of the elements it ran that was padding (NaN: it pads nothing, or no statistics).
    avg_batch: float = math.nan
    padding_pct: float = math.nan
    within_budget: bool | None = None  # None: not measured
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepSettings:
    url: str  # http://host:port: the repository API and config calls, always HTTP
    model: str
    axes: Axes
    # The model the load goes to (default: `model`): an ensemble that `model` is a step of,
    # as clients call it. Configs are loaded for `model`, and its statistics are read.
    measure_model: str = ""
    concurrency: int = 8
    duration_s: float = 5.0
    warmup_s: float = 1.0
    p99_ms: float | None = None
    batch_size: int = 1
    input_data: str = "random"
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    http_binary: bool = False
    timeout_s: float = 60.0
    load_timeout_s: float = 300.0
    protocol: str = "http"  # what the measurement uses: "http" (at url) or "grpc" (at grpc_url)
    grpc_url: str = ""  # host:port

    @property
    def measure_url(self) -> str:
        return self.grpc_url if self.protocol == "grpc" else self.url

    @property
    def measured(self) -> str:
        """The model the load goes to."""
        return self.measure_model or self.model


def strip_checksum(config: dict[str, Any]) -> dict[str, Any]:
    """The config as served, less the `model_checksum` parameter inferd adds."""
    doc = copy.deepcopy(config)
    params = doc.get("parameters")
    if isinstance(params, dict):
        params.pop(CHECKSUM_PARAMETER, None)
    return doc


ADMIN_HINT = (
    "the server's repository API is off (403): start it with --admin-api on, or with "
    "--model-control-mode explicit, to let inferd tune load candidate configs"
)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _errors_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))


async def check_measured(s: SweepSettings, api: RepositoryApi) -> None:
    """Fail fast, before any load, when the address measured at does not serve the measured
    model, or when that model is an ensemble without the tuned model among its steps:
    otherwise every candidate would fail alike and the sweep would only say so at the end."""
    if s.measure_model and s.measure_model != s.model:
        try:
            config = await api.config(s.measure_model)
        except TuneError as e:
            raise TuneError(f"--measure-model {s.measure_model}: {e}") from None
        steps = (config.get("ensemble_scheduling") or {}).get("step") or []
        names = [str(step.get("model_name")) for step in steps]
        if steps and s.model not in names:
            raise TuneError(
                f"--measure-model {s.measure_model}: its ensemble steps ({', '.join(names)}) "
                f"do not include {s.model!r}, so measuring through it would not exercise it"
            )
        # An ensemble refuses a step whose max_batch_size is below its own (Triton's rule):
        # every such candidate would leave it unready.
        ceiling = int(config.get("max_batch_size") or 0)
        smaller = [m for m in s.axes.max_batch_sizes if m < ceiling]
        if steps and smaller:
            raise TuneError(
                f"--max-batch-sizes {','.join(map(str, smaller))}: below the max_batch_size "
                f"{ceiling} of ensemble {s.measure_model!r} (--measure-model), which refuses a "
                f"step that batches less than it does; use sizes >= {ceiling}"
            )
    if s.protocol != "grpc":
        return
    try:
        async with ServerApi("grpc", s.grpc_url, s.measured, "") as grpc_api:
            await grpc_api.metadata()
    except BenchError as e:
        raise TuneError(f"over gRPC at {s.grpc_url} (--grpc-url): {e}") from None


async def measure(s: SweepSettings) -> LevelResult:
    config = BenchConfig(
        url=s.measure_url,
        protocol=s.protocol,
        model=s.measured,
        stats_model=s.model,
        http_binary=s.http_binary,
        input_data=s.input_data,
        shapes=s.shapes,
        batch_size=s.batch_size,
        concurrency=[s.concurrency],
        warmup_s=s.warmup_s,
        duration_s=s.duration_s,
        timeout_s=s.timeout_s,
    )
    result = await run(config)
    return result.levels[0]


@dataclass
class SweepResult:
    original: dict[str, Any]
    outcomes: list[Outcome]
    best: Outcome | None
    restored: bool  # the original (or, with keep_best, the best) config is loaded again
    restore_error: str = ""


async def sweep(
    s: SweepSettings, keep_best: bool = False, log: Callable[[str], None] = _log
) -> SweepResult:
    async with RepositoryApi(s.url, s.model, s.load_timeout_s) as api:
        served = await api.config()
        original = strip_checksum(served)
        check_axes(original, s.axes, s.model)
        await check_measured(s, api)
        # Probe the repository API with a reload of the config as served: a 403 here means
        # the admin API is off, before anything has changed.
        status, message = await api.load(original)
        if status == 403:
            raise TuneError(ADMIN_HINT)
        if status == 401:
            raise TuneError(
                f"the server's repository API needs a credential (401: {message}); set "
                f"{ADMIN_TOKEN_ENV} to its admin token"
            )
        if status != 200:
            raise TuneError(
                f"model {s.model!r}: reloading its own config answered {status}: {message}"
            )
        outcomes: list[Outcome] = []
        failed: dict[tuple[object, ...], Outcome] = {}
        candidates = grid(s.axes)
        try:
            for i, c in enumerate(candidates, 1):
                prefix = f"[{i}/{len(candidates)}] {c.label()}"
                stop = failed.get(c.branch())
                if stop is not None:
                    outcomes.append(Outcome(c, "skipped", _skip_reason(stop)))
                    log(f"{prefix}: skipped ({outcomes[-1].detail})")
                    continue
                outcomes.append(await _try(api, s, original, c, prefix, log))
                if outcomes[-1].status != "ok":
                    failed[c.branch()] = outcomes[-1]
        finally:
            best = pick_best(outcomes)
            final = best.config if keep_best and best is not None else original
            restore_error = await _restore(api, final)
    return SweepResult(original, outcomes, best, not restore_error, restore_error)


async def _restore(api: RepositoryApi, config: dict[str, Any]) -> str:
    """Load `config` again; "" when it loaded, else why not (a load that fails answers an
    error: the server never reports a version it kept serving as the new one)."""
    status, message = await api.load(config)
    return "" if status == 200 else f"{status}: {message}"


def _skip_reason(stop: Outcome) -> str:
    what = "ran out of memory" if stop.status == OUT_OF_MEMORY else "failed"
    return f"max_batch_size {stop.candidate.max_batch_size} {what} in this branch"


def _failed(
    outcome: Outcome, status: str, detail: str, evidence: list[str], say: Callable[[str], None]
) -> Outcome:
    """Mark `outcome` failed with `status`, or "out of memory" when a message in `evidence` (the
    load error, the failed requests' messages) says so: the table and log then say why."""
    outcome.detail = detail
    if any(is_out_of_memory(m) for m in evidence):
        outcome.status = OUT_OF_MEMORY
        say(
            f"out of memory at max_batch_size {outcome.candidate.max_batch_size}; "
            f"skipping bigger max_batch_size in this branch ({detail})"
        )
    else:
        outcome.status = status
        say(f"{status}: {detail}; skipping bigger max_batch_size")
    return outcome


def _request_errors(level: LevelResult) -> tuple[str, list[str]]:
    """The detail for a measurement with failed requests, and the failed requests' sampled
    messages. The example message is an out-of-memory one if there is one, since that is the
    reason the branch stops; else the most frequent."""
    messages = sorted(level.error_messages, key=lambda m: -level.error_messages[m])
    example = next((m for m in messages if is_out_of_memory(m)), messages[0] if messages else "")
    detail = f"request errors ({_errors_text(level.errors)})"
    return (f"{detail}, e.g. {example}" if example else detail), messages


async def _try(
    api: RepositoryApi,
    s: SweepSettings,
    original: dict[str, Any],
    c: Candidate,
    prefix: str,
    log: Callable[[str], None],
) -> Outcome:
    def say(line: str) -> None:
        log(f"{prefix}: {line}")

    config = candidate_config(original, c)
    outcome = Outcome(c, "ok", config=config)
    say("loading")
    status, message = await api.load(config)
    if status == 403:
        raise TuneError(ADMIN_HINT)
    if status != 200:
        return _failed(outcome, "load failed", f"{status}: {message}", [message], say)
    through = f" through {s.measured}" if s.measured != s.model else ""
    say(
        f"measuring{through} over {s.protocol} for {s.duration_s:g} s at concurrency "
        f"{s.concurrency}"
    )
    try:
        level = await measure(s)
    except BenchError as e:
        return _failed(outcome, "bench errors", f"bench failed: {e}", [str(e)], say)
    outcome.throughput = level.throughput
    outcome.p50_ms = level.latency_ms.get("p50", math.nan)
    outcome.p99_ms = level.latency_ms.get("p99", math.nan)
    if level.server is not None:
        outcome.avg_batch = level.server["avg_batch"]
        outcome.padding_pct = level.server["padding_pct"]
    if level.errors:
        detail, messages = _request_errors(level)
        return _failed(outcome, "bench errors", detail, messages, say)
    if level.successes == 0:
        return _failed(outcome, "bench errors", "no request succeeded", [], say)
    if s.measured != s.model and level.server is not None and not level.server["executions"]:
        detail = f"{s.measured} answered, but {s.model} executed nothing: it does not call it"
        return _failed(outcome, "not exercised", detail, [], say)
    outcome.within_budget = s.p99_ms is None or outcome.p99_ms <= s.p99_ms
    say(
        f"{outcome.throughput:,.1f} req/s, p50 {outcome.p50_ms:.2f} ms, p99 {outcome.p99_ms:.2f} "
        f"ms, {s.model}: {outcome.avg_batch:.2f} rows a batch, {outcome.padding_pct:.1f}% padding"
    )
    return outcome


def pick_best(outcomes: list[Outcome]) -> Outcome | None:
    """The highest throughput among measured candidates whose p99 is within the budget."""
    good = [o for o in outcomes if o.status == "ok" and o.within_budget]
    return max(good, key=lambda o: o.throughput, default=None)


# The optional axes' table columns: the Candidate field, its heading.
AXIS_COLUMNS = (
    ("intra_op_threads", "threads"),
    ("graph_level", "graph"),
    ("pad_waste", "pad_waste"),
    ("pad_window", "pad_window"),
)


def _figure(value: float, fmt: str) -> str:
    return "-" if math.isnan(value) else format(value, fmt)


def table(outcomes: list[Outcome], best: Outcome | None, p99_budget: float | None) -> str:
    """One row per candidate: its settings (the optional axes only when swept), what was
    measured, and the tuned model's own batch size and padding, which say why a row wins."""
    axes = [
        (name, heading)
        for name, heading in AXIS_COLUMNS
        if any(getattr(o.candidate, name) is not None for o in outcomes)
    ]
    header = ["#", "max_batch", "delay_us", "instances", "preferred",
              *(heading for _, heading in axes), "req/s", "p50 ms", "p99 ms",
              "avg batch", "pad %", "within budget", "note"]  # fmt: skip
    rows = [header]
    for i, o in enumerate(outcomes, 1):
        c = o.candidate
        measured = o.status == "ok"
        verdict = {None: "-", True: "yes", False: "no"}[o.within_budget]
        note = "best" if o is best else ("" if measured else f"{o.status}: {o.detail}")
        rows.append(
            [
                str(i),
                str(c.max_batch_size),
                str(c.delay_us),
                str(c.instances),
                "on" if c.preferred else "off",
                *(str(getattr(c, name)) for name, _ in axes),
                f"{o.throughput:,.1f}" if measured else "-",
                f"{o.p50_ms:.2f}" if measured else "-",
                f"{o.p99_ms:.2f}" if measured else "-",
                _figure(o.avg_batch, ".2f") if measured else "-",
                _figure(o.padding_pct, ".1f") if measured else "-",
                verdict,
                note,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = []
    for r in rows:
        cells = [r[i].rjust(widths[i]) for i in range(len(widths))]
        lines.append("  ".join(cells + [r[-1]]).rstrip())
    budget = "none" if p99_budget is None else f"{p99_budget:g} ms"
    lines.insert(0, f"p99 budget: {budget}")
    return "\n".join(lines)
