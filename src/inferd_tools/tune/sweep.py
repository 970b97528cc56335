"""The sweep itself: candidates from the grid, the repository API calls, one bench run each."""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.public import ADMIN_TOKEN_ENV
from inferd_tools.bench.api import ServerApi
from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.runner import BenchConfig, LevelResult, run
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


@dataclass(frozen=True)
class Candidate:
    max_batch_size: int
    delay_us: int
    instances: int
    preferred: bool

    def label(self) -> str:
        return (
            f"max_batch_size={self.max_batch_size} delay_us={self.delay_us} "
            f"instances={self.instances} preferred={'on' if self.preferred else 'off'}"
        )

    def branch(self) -> tuple[int, int, bool]:
        """Everything but max_batch_size: a failure skips bigger batches of the same branch."""
        return (self.delay_us, self.instances, self.preferred)


@dataclass
class Outcome:
    candidate: Candidate
    status: str  # "ok", "load failed", "bench errors", "out of memory", "skipped"
    detail: str = ""
    throughput: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    within_budget: bool | None = None  # None: not measured
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepSettings:
    url: str  # http://host:port: the repository API and config calls, always HTTP
    model: str
    max_batch_sizes: list[int]
    delays_us: list[int]
    instances: list[int]
    preferred: list[bool]
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


def grid(s: SweepSettings) -> list[Candidate]:
    """Every combination; max_batch_size varies fastest and ascending, so a failure can skip
    the bigger sizes of its branch."""
    return [
        Candidate(m, d, n, p)
        for p in s.preferred
        for n in s.instances
        for d in s.delays_us
        for m in sorted(s.max_batch_sizes)
    ]


def strip_checksum(config: dict[str, Any]) -> dict[str, Any]:
    """The config as served, less the `model_checksum` parameter inferd adds."""
    doc = copy.deepcopy(config)
    params = doc.get("parameters")
    if isinstance(params, dict):
        params.pop(CHECKSUM_PARAMETER, None)
    return doc


def candidate_config(original: dict[str, Any], c: Candidate) -> dict[str, Any]:
    """The original config with the candidate's settings applied."""
    doc = copy.deepcopy(original)
    doc["max_batch_size"] = c.max_batch_size
    batching = dict(doc.get("dynamic_batching") or {})
    batching["max_queue_delay_microseconds"] = c.delay_us
    batching["preferred_batch_size"] = [c.max_batch_size] if c.preferred else []
    doc["dynamic_batching"] = batching
    groups = doc.get("instance_group") or [{}]
    first = dict(groups[0])
    first["count"] = c.instances
    doc["instance_group"] = [first]
    return doc


def to_pbtxt(config: dict[str, Any]) -> str:
    """A config (Triton's JSON form) as config.pbtxt text."""
    message = mc.ModelConfig()
    json_format.ParseDict(config, message)
    text: str = text_format.MessageToString(message)
    return text


ADMIN_HINT = (
    "the server's repository API is off (403): start it with --admin-api on, or with "
    "--model-control-mode explicit, to let inferd tune load candidate configs"
)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _errors_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))


async def check_grpc(s: SweepSettings) -> None:
    """Fail fast, before any load, when the gRPC address measured at does not serve the model:
    otherwise every candidate would fail alike and the sweep would only say so at the end."""
    if s.protocol != "grpc":
        return
    try:
        async with ServerApi("grpc", s.grpc_url, s.model, "") as api:
            await api.metadata()
    except BenchError as e:
        raise TuneError(f"over gRPC at {s.grpc_url} (--grpc-url): {e}") from None


async def measure(s: SweepSettings) -> LevelResult:
    config = BenchConfig(
        url=s.measure_url,
        protocol=s.protocol,
        model=s.model,
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
        await check_grpc(s)
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
        failed: dict[tuple[int, int, bool], Outcome] = {}
        candidates = grid(s)
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
    say(f"measuring over {s.protocol} for {s.duration_s:g} s at concurrency {s.concurrency}")
    try:
        level = await measure(s)
    except BenchError as e:
        return _failed(outcome, "bench errors", f"bench failed: {e}", [str(e)], say)
    outcome.throughput = level.throughput
    outcome.p50_ms = level.latency_ms.get("p50", math.nan)
    outcome.p99_ms = level.latency_ms.get("p99", math.nan)
    if level.errors:
        detail, messages = _request_errors(level)
        return _failed(outcome, "bench errors", detail, messages, say)
    if level.successes == 0:
        return _failed(outcome, "bench errors", "no request succeeded", [], say)
    outcome.within_budget = s.p99_ms is None or outcome.p99_ms <= s.p99_ms
    say(
        f"{outcome.throughput:,.1f} req/s, p50 {outcome.p50_ms:.2f} ms, p99 {outcome.p99_ms:.2f} ms"
    )
    return outcome


def pick_best(outcomes: list[Outcome]) -> Outcome | None:
    """The highest throughput among measured candidates whose p99 is within the budget."""
    good = [o for o in outcomes if o.status == "ok" and o.within_budget]
    return max(good, key=lambda o: o.throughput, default=None)


def table(outcomes: list[Outcome], best: Outcome | None, p99_budget: float | None) -> str:
    header = ["#", "max_batch", "delay_us", "instances", "preferred", "req/s", "p50 ms",
              "p99 ms", "within budget", "note"]  # fmt: skip
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
                f"{o.throughput:,.1f}" if measured else "-",
                f"{o.p50_ms:.2f}" if measured else "-",
                f"{o.p99_ms:.2f}" if measured else "-",
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
