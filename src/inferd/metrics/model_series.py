"""What the metrics sink records per model version, in plain numbers updated on the event
loop: counts and histogram buckets (prometheus.py records them, model_families.py exports
them)."""

from __future__ import annotations

from bisect import bisect_left

# 0.1 ms .. 10 s: from a tiny model's queue wait to a slow model's whole request.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
GC_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)


class _Histogram:
    """A Prometheus histogram's state, updated from the event loop only (no lock needed):
    observing is one bisect and two additions, several times cheaper than
    prometheus_client's locked histograms on this hot path."""

    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1  # le: value <= bound
        self.total += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        counts, total = list(self.counts), self.total  # one consistent snapshot
        out, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out, total


class Series:
    """Everything counted per model version, in plain numbers."""

    __slots__ = (
        "success", "inferences", "executions", "duration", "queue", "compute_input",
        "compute_infer", "compute_output", "batch_size",
    )  # fmt: skip

    def __init__(self) -> None:
        self.success = 0
        self.inferences = 0
        self.executions = 0
        self.duration = _Histogram(LATENCY_BUCKETS_S)
        self.queue = _Histogram(LATENCY_BUCKETS_S)
        self.compute_input = _Histogram(LATENCY_BUCKETS_S)
        self.compute_infer = _Histogram(LATENCY_BUCKETS_S)
        self.compute_output = _Histogram(LATENCY_BUCKETS_S)
        self.batch_size = _Histogram(tuple(float(b) for b in BATCH_BUCKETS))


# (name, help) of the per-version histograms, in Series attribute order.
HISTOGRAMS = {
    "duration": ("inferd_request_duration_seconds", "End-to-end time of successful requests."),
    "queue": ("inferd_queue_duration_seconds", "Time a request waited in the queue for a batch."),
    "compute_input": (
        "inferd_compute_input_duration_seconds",
        "Time merging a request's batch inputs.",
    ),
    "compute_infer": (
        "inferd_compute_infer_duration_seconds",
        "Model execution time of a request's batch.",
    ),
    "compute_output": (
        "inferd_compute_output_duration_seconds",
        "Time splitting and checking a request's outputs.",
    ),
    "batch_size": ("inferd_batch_size", "Rows per executed batch."),
}
