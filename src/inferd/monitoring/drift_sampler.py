"""One model version's drift monitor: samples of executed batches go to a bounded queue
that one background thread drains into sliding windows, testing each full window against
the reference (docs/monitoring.md).

The request path pays one coin flip and one `put_nowait` per executed batch, on the event
loop, holding references to arrays the batch already made (no copy). When the queue is
full, the sample is dropped and counted; the thread spends at most `drift_cpu_budget` of
one core (it rests in proportion to the work it did, and the queue fills and drops
meanwhile), so monitoring can never slow the requests more than that.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inferd.monitoring.drift import chi_square, ks_test, psi
from inferd.monitoring.drift_spec import DriftOptions
from inferd.monitoring.reference import Reference, TensorPlan, TensorReference, features, prepare

if TYPE_CHECKING:
    from inferd.scheduling.pending import Pending, Result

log = logging.getLogger("inferd.monitoring")

# Samples waiting for the thread; more are dropped and counted. Small: a sample holds its
# batch's arrays alive (a batch of images is megabytes), and while the thread rests within
# its budget nothing is queued at all.
QUEUE_BATCHES = 8


# A queued sample: the batch, its results, and copies of the inputs of its requests whose
# own are borrowed (by index in the batch).
Sample = tuple["Sequence[Pending]", "Sequence[Result]", dict[int, dict[str, np.ndarray]]]


@dataclass(frozen=True, slots=True)
class WindowTest:
    score: float  # the worst column's: KS statistic, PSI, or Cramér's V of the classes
    p_value: float | None  # KS: the worst column's, times the columns tested (capped at 1)
    worst_column: int
    alerting: bool  # past the model's threshold in the latest window


@dataclass(frozen=True, slots=True)
class TensorDrift:
    """The latest window's tests of one tensor."""

    tests: dict[str, WindowTest]  # "ks", "psi" or "chi2"
    per_column: dict[str, list[float]]  # "ks", "ks_p_value", "psi" -> one value per column
    window_rows: int
    windows: int  # windows tested so far


class DriftMonitor:
    def __init__(
        self,
        name: str,
        version: str,
        plans: dict[str, TensorPlan],
        options: DriftOptions,
        batched: bool,
        reference: Reference | None,
    ) -> None:
        self.name = name
        self.version = version
        self.options = options
        self._plans = plans
        self._batched = batched
        self._queue: queue.Queue[Sample | None] = queue.Queue(QUEUE_BATCHES)
        self.dropped = 0  # samples dropped: resting or queue full (written on the loop only)
        self.sampled = 0  # samples queued (idem)
        self.rows_seen = 0  # rows the thread took in (written by the thread only)
        self.rows_skipped = 0  # rows whose column count is not the reference's
        self.failures = 0  # samples the thread failed on (a bug: logged once)
        self.cpu_s = 0.0  # CPU time the thread spent on samples and tests (its own clock)
        self.latest: dict[str, TensorDrift] = {}  # replaced whole, never mutated in place
        self._lock = threading.Lock()  # the reference and the windows, against set_reference
        self._reference = reference
        self._windows: dict[str, list[np.ndarray]] = {}
        self._held: dict[str, int] = {}  # rows in each tensor's window chunks
        self._collected: dict[str, list[np.ndarray]] = {}  # first:K, until it has K rows
        self._collected_rows = 0
        self._stop = threading.Event()
        self._resting = False  # the thread is resting within its CPU budget
        self._thread = threading.Thread(
            target=self._run, name=f"inferd-drift-{name}-{version}", daemon=True
        )

    def start(self) -> None:
        """Start the thread: once the version is about to serve."""
        self._thread.start()

    @property
    def reference(self) -> Reference | None:
        return self._reference

    @property
    def collecting(self) -> bool:
        """Building its reference from the first rows served (`first:K`)."""
        return self._reference is None and self.options.first_rows > 0

    # -- on the event loop, after a batch executed ---------------------------------------

    def on_executed(self, batch: Sequence[Pending], results: Sequence[Result]) -> None:
        rate = self.options.sample_rate
        if rate < 1.0 and random.random() >= rate:
            return
        if self._resting:  # within its CPU budget it would not take it before the next
            self.dropped += 1
            return
        try:
            self._queue.put_nowait((batch, results, _owned_inputs(batch)))
        except queue.Full:
            self.dropped += 1
        else:
            self.sampled += 1

    # -- anywhere ------------------------------------------------------------------------

    def set_reference(self, reference: Reference) -> None:
        """Replace the reference (admin endpoint); the windows start again."""
        with self._lock:
            self._reference = reference
            self._windows = {}
            self._held = {}
            self._collected = {}
            self.latest = {}

    def close(self) -> None:
        self._stop.set()
        # When the queue is full, the thread sees _stop once it takes the next sample.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def wait_idle(self) -> None:
        """Until every sample queued so far is processed (tests and tools)."""
        self._queue.join()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        budget = self.options.cpu_budget
        while not self._stop.is_set():
            item = self._queue.get()
            try:
                if item is None:
                    return
                started = time.thread_time()
                try:
                    with self._lock:
                        self._take(*item)
                except Exception:
                    # Logged once: a model whose tensors the monitor cannot read would fail
                    # every sample the same way.
                    self.failures += 1
                    if self.failures == 1:
                        log.exception(
                            "model %s version %s: a drift sample failed (logged once; "
                            "counted in the drift report's sample_failures)",
                            *self._names,
                        )
                spent = time.thread_time() - started
                self.cpu_s += spent
            finally:
                self._queue.task_done()
            if budget < 1.0 and spent > 0:
                self._resting = True
                self._stop.wait(spent * (1.0 / budget - 1.0))
                self._resting = False

    @property
    def _names(self) -> tuple[str, str]:
        return self.name, self.version

    def _take(
        self,
        batch: Sequence[Pending],
        results: Sequence[Result],
        copies: dict[int, dict[str, np.ndarray]],
    ) -> None:
        """One executed batch: each tensor's rows of its requests joined, so the features
        and the windows take one numpy step per tensor, not per request."""
        reference = self._reference
        wanted = reference.tensors if reference is not None else self._plans
        parts: dict[str, list[np.ndarray]] = {name: [] for name in wanted}
        rows = 0
        for i, (p, out) in enumerate(zip(batch, results, strict=False)):
            if p.filler or not isinstance(out, dict):
                continue
            inputs = copies.get(i, p.request.inputs)
            rows += p.request.rows if self._batched else 1
            for name, arrays in parts.items():
                array = inputs.get(name)
                if array is None:
                    array = out.get(name)
                if array is not None:
                    # Unbatched models: the whole tensor is one row.
                    arrays.append(array if self._batched else array[np.newaxis])
        joined: dict[str, np.ndarray] = {}
        for name, arrays in parts.items():
            if len(arrays) == 1:
                joined[name] = arrays[0]
            elif arrays:
                try:
                    joined[name] = np.concatenate(arrays)
                except ValueError:  # variable dims: requests of different sizes
                    joined[name] = np.concatenate([a.reshape(len(a), -1)[:, :0] for a in arrays])
        if rows:
            self.ingest(joined, rows)

    def ingest(self, tensors: Mapping[str, np.ndarray], rows: int) -> None:
        """Tensors of `rows` rows (inputs and outputs, rows first) into the windows, or
        into the reference being collected. On the monitor's thread (tests: any thread
        while the monitor is not started)."""
        reference = self._reference
        if reference is None and not self.collecting:
            return
        wanted = reference.tensors if reference is not None else self._plans
        cap = self.options.max_columns
        for name in wanted:
            array = tensors.get(name)
            if array is None:
                continue
            feats = features(self._plans[name], array, len(array), cap)
            if reference is None:
                self._collected.setdefault(name, []).append(feats)
            else:
                self._add(name, reference.tensors[name], feats)
        if reference is None:
            self._collected_rows += rows
            if self._collected_rows >= self.options.first_rows:
                self._finish_collecting()
        self.rows_seen += rows  # last: a report that counts these rows has their windows

    def _finish_collecting(self) -> None:
        tensors: dict[str, TensorReference] = {}
        for name, chunks in self._collected.items():
            try:
                tensors[name] = prepare(self._plans[name], np.concatenate(chunks))
            except ValueError:  # variable dims: rows of different column counts
                log.warning(
                    "model %s version %s: drift reference: '%s' has rows of different "
                    "sizes; it is not monitored",
                    *self._names,
                    name,
                )
        self._collected = {}
        self._reference = Reference(tensors, f"first:{self.options.first_rows}")
        log.info(
            "model %s version %s: drift reference built from the first %d rows",
            *self._names,
            self._collected_rows,
        )

    def _add(self, name: str, ref: TensorReference, feats: np.ndarray) -> None:
        if ref.columns is not None and feats.shape[1] != ref.columns.columns:
            self.rows_skipped += feats.shape[0]
            return
        chunks = self._windows.setdefault(name, [])
        chunks.append(feats)
        held = self._held.get(name, 0) + len(feats)
        size = self.options.window
        if held < size:
            self._held[name] = held
            return
        window = np.concatenate(chunks)[-size:]
        # Windows slide by half their size: each row is tested in two windows.
        self._windows[name] = [window[size // 2 :]]
        self._held[name] = size - size // 2
        previous = self.latest.get(name)
        done = previous.windows + 1 if previous is not None else 1
        self.latest = {**self.latest, name: self._test(ref, window, done)}

    def _test(self, ref: TensorReference, window: np.ndarray, windows: int) -> TensorDrift:
        opts = self.options
        if ref.classes is not None:
            w, p, _ = chi_square(ref.classes, window)
            result = WindowTest(w, p, 0, p < opts.p_value_threshold)
            return TensorDrift({"chi2": result}, {}, len(window), windows)
        assert ref.columns is not None
        d, p_values = ks_test(ref.columns, window)
        stability = psi(ref.columns, window)
        worst_ks = int(d.argmax())
        adjusted = min(1.0, float(p_values.min()) * len(d))
        worst_psi = int(stability.argmax())
        tests = {
            "ks": WindowTest(
                float(d[worst_ks]), adjusted, worst_ks, adjusted < opts.p_value_threshold
            ),
            "psi": WindowTest(
                float(stability[worst_psi]),
                None,
                worst_psi,
                float(stability[worst_psi]) > opts.psi_threshold,
            ),
        }
        per_column = {
            "ks": d.tolist(),
            "ks_p_value": p_values.tolist(),
            "psi": stability.tolist(),
        }
        return TensorDrift(tests, per_column, len(window), windows)


def _owned_inputs(batch: Sequence[Pending]) -> dict[int, dict[str, np.ndarray]]:
    """Copies of the inputs the batch's requests only borrow (shared memory, the engine
    hop's slab), made before they are answered and the memory reused: only for a sample
    that is queued, so at most a few batches a second within the CPU budget."""
    copies: dict[int, dict[str, np.ndarray]] = {}
    for i, p in enumerate(batch):
        if p.request.borrowed:
            copies[i] = {name: a.copy() for name, a in p.request.inputs.items()}
    return copies
