"""Triton's statistics extension: cumulative counts and durations per model version.

A telemetry sink; `GET /v2/models/{m}[/versions/{v}]/stats` and gRPC ModelStatistics render
it in Triton's shape, so perf_analyzer prints its server-side breakdown against inferd.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferd.events import BatchRecord, Gone, RequestRecord, ResponseTimes, forget_keys


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStats:
    """Triton's `response_stats` entry: the responses at one position of decoupled streams."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def add(self, times: ResponseTimes) -> None:
        if times.kind == "success":
            self.compute_infer.add(times.infer_ns)
            self.compute_output.add(times.output_ns)
            self.success.add(times.infer_ns + times.output_ns)
        elif times.kind == "fail":
            self.compute_infer.add(times.infer_ns)
            self.fail.add(times.infer_ns + times.output_ns)
        elif times.kind == "empty":
            self.empty_response.add(times.infer_ns)
        else:
            self.cancel.add(0)

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {
            "compute_infer": self.compute_infer.to_dict(),
            "compute_output": self.compute_output.to_dict(),
            "success": self.success.to_dict(),
            "fail": self.fail.to_dict(),
            "empty_response": self.empty_response.to_dict(),
            "cancel": self.cancel.to_dict(),
        }


@dataclass(slots=True)
class VersionStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    # The response cache, as Triton's: a hit's lookup and extraction, a miss's lookup and
    # insert (docs/cache.md). Hits count in success and queue, never as executions.
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # inferd's own: requests that waited for an identical request's execution (the cache's
    # single flight): in success and queue (their wait), neither a hit, a miss nor an
    # execution. Rendered as the entry's `coalesced` field for versions with the cache.
    coalesced: Duration = field(default_factory=Duration)
    # Models with pad_inputs: [batches, real, padded] elements of the padded inputs (the
    # entry's inferd field `padding`).
    padding: list[int] = field(default_factory=lambda: [0, 0, 0])
    inference_count: int = 0  # rows inferred
    execution_count: int = 0  # batches executed
    last_inference_ms: int = 0  # ms since the epoch
    batches: dict[int, BatchStats] = field(default_factory=lambda: defaultdict(BatchStats))
    # Decoupled models: by position in the stream ("0" the first response, ...).
    responses: dict[int, ResponseStats] = field(default_factory=lambda: defaultdict(ResponseStats))


class StatisticsSink:
    def __init__(self) -> None:
        self.versions: dict[tuple[str, str], VersionStats] = defaultdict(VersionStats)

    def on_request(self, record: RequestRecord) -> None:
        if not record.model or not record.version:
            return  # a request no model version accepted belongs to none
        stats = self.versions[(record.model, record.version)]
        if record.responses is not None:  # a decoupled model's request: each response too
            for position, response in enumerate(record.responses):
                stats.responses[position].add(response)
        if record.failure is not None:
            stats.fail.add(record.duration_ns)
            return
        stats.success.add(record.duration_ns)
        if record.cache:
            if record.cache == "hit":
                stats.cache_hit.add(record.cache_ns)
                stats.queue.add(0)  # Triton's queue count includes hits; they never queue
            elif record.cache == "miss":
                stats.cache_miss.add(record.cache_ns)
            else:  # "coalesced": its wait for the identical request's execution is queue time
                stats.coalesced.add(record.cache_ns)
                stats.queue.add(record.cache_ns)
        if record.steps is not None:
            # An ensemble executes no batch of its own (its steps' models count theirs): as
            # Triton, each request it answered counts as one execution of its rows.
            stats.inference_count += record.rows
            stats.execution_count += 1
        times = record.times
        if times is not None:
            # Triton's per-request durations: each request counts its batch's compute time.
            # (Duration.add inlined: this runs on every request.)
            queue, c_in, c_infer, c_out = (
                stats.queue, stats.compute_input, stats.compute_infer, stats.compute_output,
            )  # fmt: skip
            queue.count += 1
            queue.ns += times.queue_ns
            c_in.count += 1
            c_in.ns += times.compute_input_ns
            c_infer.count += 1
            c_infer.ns += times.compute_infer_ns
            c_out.count += 1
            c_out.ns += times.compute_output_ns
        stats.last_inference_ms = int(time.time() * 1000)

    def on_batch(self, record: BatchRecord) -> None:
        if record.failed:
            return
        stats = self.versions[(record.model, record.version)]
        # Counted with the execution, as Triton does: a statistics call between a batch and
        # its requests' completion must never see an execution without its rows.
        stats.inference_count += record.rows
        stats.execution_count += 1
        if record.padded_elements:
            padding = stats.padding
            padding[0] += 1
            padding[1] += record.real_elements
            padding[2] += record.padded_elements
        batch = stats.batches[record.rows]
        batch.compute_input.add(record.compute_input_ns)
        batch.compute_infer.add(record.compute_infer_ns)
        batch.compute_output.add(record.compute_output_ns)

    def forget(self, gone: Gone) -> None:
        """Unloaded versions' statistics go, as Triton's go with the unloaded model: loaded
        again, a version counts from zero."""
        forget_keys(self.versions, gone)

    def model_stats(self, name: str, versions: list[str]) -> list[dict[str, Any]]:
        """Triton's `model_stats` entries for the given versions of a model."""
        return [
            self._render(name, v, self.versions.get((name, v), VersionStats())) for v in versions
        ]

    def coalesced(self, name: str, version: str) -> dict[str, int]:
        """inferd's `coalesced` field of a version's entry: {"count", "ns"}."""
        stats = self.versions.get((name, version))
        return (stats.coalesced if stats is not None else Duration()).to_dict()

    def padding(self, name: str, version: str) -> dict[str, int]:
        """inferd's `padding` field of a version's entry (a model with pad_inputs): batches
        executed, and the elements of the padded inputs sent and received once padded."""
        stats = self.versions.get((name, version))
        batches, real, padded = stats.padding if stats is not None else (0, 0, 0)
        return {"batches": batches, "real_elements": real, "padded_elements": padded}

    @staticmethod
    def _render(name: str, version: str, s: VersionStats) -> dict[str, Any]:
        return {
            "name": name,
            "version": version,
            "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {
                "success": s.success.to_dict(),
                "fail": s.fail.to_dict(),
                "queue": s.queue.to_dict(),
                "compute_input": s.compute_input.to_dict(),
                "compute_infer": s.compute_infer.to_dict(),
                "compute_output": s.compute_output.to_dict(),
                "cache_hit": s.cache_hit.to_dict(),
                "cache_miss": s.cache_miss.to_dict(),
            },
            "response_stats": {str(k): r.to_dict() for k, r in sorted(s.responses.items())},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.to_dict(),
                    "compute_infer": b.compute_infer.to_dict(),
                    "compute_output": b.compute_output.to_dict(),
                }
                for size, b in sorted(s.batches.items())
            ],
            "memory_usage": [],
        }


LocalStatistics = Callable[[str, str], dict[str, Any]]  # this process's, by (model, version)


class StatisticsProvider(Protocol):
    """Where Triton's statistics of the whole server come from: this process's own, or with
    `--workers N` every worker's summed (workers/worker_statistics.py)."""

    async def model_statistics(self, name: str, version: str) -> dict[str, Any]: ...

    def forget(self, gone: Gone) -> None:
        """Drop what is kept of versions that are gone (the registry's unloads)."""


class ProcessStatistics:
    """One process: its own statistics are the server's."""

    def __init__(self, local: LocalStatistics) -> None:
        self.local = local

    async def model_statistics(self, name: str, version: str) -> dict[str, Any]:
        return self.local(name, version)

    def forget(self, gone: Gone) -> None:
        pass  # keeps nothing of its own
