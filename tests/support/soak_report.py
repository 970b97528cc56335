"""The soak's counts and its verdict: every answer classified as it arrives (`Tally`), and
at the end the pass criteria applied (`verdict`) and written out (`summary`).

Pass (docs/reliability.md, "The soak"): every valid request answered right (the model's
output, from a version that may answer then), or refused with 429/503 (gRPC
RESOURCE_EXHAUSTED/UNAVAILABLE) inside a burst or kill window, or its connection lost
inside a worker-kill window (counted); no other answer to a valid request; every invalid or
hostile request answered as its kind allows, and every slow client closed by the server
within its limit; readiness never false (nor unanswered) outside a kill (or burst) window;
every deployed version answered; the killed worker back and Redis back; the shared
cache hitting after Redis came back; every server process's RSS, descriptors and threads
flat after warm-up (least-squares slope within its bound); the server exiting 0 on SIGTERM.

Each finding has a kind (the `findings` counter) and a few examples with times.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.support.soak_plan import ALLOWED, BURST, REDIS_KILL, WORKER_KILL, VersionBook, Windows
from tests.support.soak_requests import Answer
from tests.support.soak_watch import Probe, ProcessSeries, slope_per_hour

EXAMPLES = 8  # kept per finding kind

# A valid request's answer that no window allows -> the finding it is.
_FINDING = {
    "429": "shed_outside_fault", "RESOURCE_EXHAUSTED": "shed_outside_fault",
    "503": "unavailable_outside_fault", "UNAVAILABLE": "unavailable_outside_fault",
    "lost": "connection_lost_outside_kill", "no_answer": "no_answer",
    "DEADLINE_EXCEEDED": "no_answer", "504": "no_answer", "stream_error": "stream_error",
}  # fmt: skip


def finding_of(status: str) -> str:
    """What a valid request's answer is when no window allows it."""
    if status in _FINDING:
        return _FINDING[status]
    if status.startswith("5") or status in ("INTERNAL", "UNKNOWN"):
        return "server_error"
    if status in ("200", "OK"):
        return "malformed_answer"
    return "valid_request_refused"


@dataclass
class Tally:
    windows: Windows
    book: VersionBook
    started: float
    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    versions: Counter[tuple[str, str]] = field(default_factory=Counter)
    hostile: Counter[tuple[str, str]] = field(default_factory=Counter)
    slow: Counter[tuple[str, str]] = field(default_factory=Counter)
    slow_held_s: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, kind: str, detail: str, at: float | None = None) -> None:
        with self._lock:
            self.findings[kind] += 1
            if len(self.examples[kind]) < EXAMPLES:
                when = f"t={at - self.started:.1f}s " if at is not None else ""
                self.examples[kind].append(when + detail[:400])

    def answer(
        self, model: str, mode: str, answer: Answer, wrong: str | None, sent: float, answered: float
    ) -> None:
        """One valid request's answer; `wrong` is the reference's objection, if any."""
        what = f"{model} {mode}"
        if answer.ok:
            self.seen_version(model, answer.version)
            if not self.book.allowed(model, answer.version, sent, answered):
                outcome = "stale_version"
                self.find(outcome, f"{what}: version {answer.version}", sent)
            elif wrong is not None:
                outcome = "wrong_answer"
                self.find(outcome, f"{what} v{answer.version}: {wrong}", sent)
            else:
                outcome = "ok"
        else:
            covering = self.windows.covering(sent, answered)
            if any(answer.status in ALLOWED[w] for w in covering):
                outcome = f"refused:{answer.status}"
                with self._lock:
                    self.refused[(",".join(sorted(covering)), answer.status)] += 1
            else:
                outcome = finding_of(answer.status)
                self.find(outcome, f"{what}: {answer.status} {answer.detail}", sent)
        with self._lock:
            self.requests[(model, mode, outcome)] += 1

    def seen_version(self, model: str, version: str) -> None:
        with self._lock:
            self.versions[(model, version)] += 1

    def hostile_answer(self, kind: str, got: str, expected: frozenset[str], sent: float) -> None:
        """`got`: a status, or several joined by commas (requests sent in a row)."""
        with self._lock:
            self.hostile[(kind, got)] += 1
        allowed = set(expected)
        for window in self.windows.covering(sent, time.monotonic()):
            allowed |= ALLOWED[window]
            if window == WORKER_KILL:  # its connection was the killed worker's
                allowed |= {"closed", "no_answer"}
        if all(part in allowed for part in got.split(",")):
            return
        self.find("hostile_unexpected_answer", f"{kind}: {got}, expected {sorted(expected)}", sent)

    def slow_client(self, kind: str, outcome: str, held_s: float, started: float) -> None:
        with self._lock:
            self.slow[(kind, outcome)] += 1
            self.slow_held_s[kind] = max(self.slow_held_s.get(kind, 0.0), held_s)
        if outcome == "kept":
            self.find("slow_client_kept", f"{kind} still open after {held_s:.0f} s", started)


# -- the verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """Growth allowed after warm-up, per hour (least-squares slope)."""

    rss_mib_h: float
    fds_h: float
    threads_h: float
    series_h: float = 200.0  # samples the metrics endpoint exports
    min_coverage: float = 0.5  # of the measured window, for a process to be judged


def process_report(
    series: ProcessSeries, since: float, until: float, warmup_s: float, bounds: Bounds
) -> dict[str, Any]:
    """One process's figures after warm-up: the run's (`since`), or its own for a process
    started later (a restarted worker warms up too). Judged only when measured over
    `bounds.min_coverage` of the run's window."""
    own_since = max(since, series.first_seen + warmup_s)
    points = [s for s in series.samples if s[0] >= own_since]
    row: dict[str, Any] = {"pid": series.pid, "role": series.role, "samples": len(points)}
    if series.samples:
        row["rss_mib_first_last"] = [round(series.samples[0][1] / 1024, 1),
                                     round(series.samples[-1][1] / 1024, 1)]  # fmt: skip
    span = (points[-1][0] - points[0][0]) if len(points) > 1 else 0.0
    if span < bounds.min_coverage * (until - since):
        row["judged"] = False
        row["why_not"] = f"measured {span:.0f} s of the {until - since:.0f} s after warm-up"
        return row
    row["judged"] = True
    row["rss_mib_per_h"] = round(slope_per_hour([(t, r / 1024) for t, r, *_ in points]), 2)
    row["fds_per_h"] = round(slope_per_hour([(t, f) for t, _, f, *_ in points]), 2)
    row["threads_per_h"] = round(slope_per_hour([(t, n) for t, _, _, n, _ in points]), 2)
    row["rss_mib_window"] = [round(points[0][1] / 1024, 1), round(points[-1][1] / 1024, 1)]
    row["fds_window"] = [points[0][2], points[-1][2]]
    row["threads_window"] = [points[0][3], points[-1][3]]
    row["client_connections_window"] = [points[0][4], points[-1][4]]  # not in fds: moved
    row["series"] = [list(p) for p in points]  # (t, RSS KiB, fds, threads, clients): --json
    return row


def judge_processes(tally: Tally, rows: list[dict[str, Any]], bounds: Bounds, at: float) -> None:
    for row in rows:
        if not row["judged"]:
            continue
        who = f"{row['role']} pid {row['pid']}"
        for key, bound, unit, kind in (
            ("rss_mib_per_h", bounds.rss_mib_h, "MiB/h", "rss_growth"),
            ("fds_per_h", bounds.fds_h, "fds/h", "fd_growth"),
            ("threads_per_h", bounds.threads_h, "threads/h", "thread_growth"),
        ):
            if row[key] > bound:
                tally.find(kind, f"{who}: {row[key]:+.1f} {unit} (bound {bound:g})", at)


def segments(
    points: list[tuple[float, float]], drop: float = 0.5
) -> list[list[tuple[float, float]]]:
    """`points` split where the value falls by more than `drop` of itself at once: a
    restarted worker's counts start again from little."""
    out: list[list[tuple[float, float]]] = []
    for point in points:
        if not out or point[1] < (1 - drop) * out[-1][-1][1]:
            out.append([])
        out[-1].append(point)
    return out


def judge_series(
    tally: Tally,
    counts: dict[str, list[tuple[float, int]]],
    since: float,
    until: float,
    warmup_s: float,
    bounds: Bounds,
) -> dict[str, Any]:
    """The samples /metrics exports, per worker (`worker` label; "" the supervisor's own),
    flat after warm-up like memory: a count that keeps growing is state kept per
    something that keeps changing (versions long unloaded). A restarted worker (its count
    falls) is judged like a process: the stretch of one process, after its own warm-up,
    when that covers enough of the window."""
    report: dict[str, Any] = {}
    for worker, series in sorted(counts.items()):
        row: dict[str, Any] = {"first_last": [c for _, c in series[:1] + series[-1:]]}
        report[worker or "supervisor"] = row
        stretches = []
        for n, stretch in enumerate(segments([(t, float(c)) for t, c in series])):
            start = since if n == 0 else max(since, stretch[0][0] + warmup_s)
            stretches.append([p for p in stretch if p[0] >= start])
        longest = max(stretches, key=lambda p: p[-1][0] - p[0][0] if p else 0.0, default=[])
        span = longest[-1][0] - longest[0][0] if len(longest) > 1 else 0.0
        if span < bounds.min_coverage * (until - since):
            row["judged"] = False
            continue
        row["window"] = [int(longest[0][1]), int(longest[-1][1])]
        row["per_h"] = round(slope_per_hour(longest), 1)
        if row["per_h"] > bounds.series_h:
            tally.find(
                "metrics_series_growth",
                f"worker {worker or '(supervisor)'}: /metrics exported {row['window'][0]} -> "
                f"{row['window'][1]} samples after warm-up, {row['per_h']:+.0f}/h "
                f"(bound {bounds.series_h:g})",
                until,
            )
    return report


UNANSWERED_STREAK = 3  # probes in a row (5 s each) before silence is a finding


def judge_readiness(tally: Tally, probes: list[Probe]) -> dict[str, Any]:
    """Readiness false outside a kill is a finding at once. A probe not answered within its
    5 s is counted, and a finding once UNANSWERED_STREAK of a protocol's probes in a row
    outside a burst or kill went unanswered (a loaded host may miss one)."""
    counts: Counter[str] = Counter()
    streak: Counter[str] = Counter()
    for p in probes:
        state = "ready" if p.ready else ("no_answer" if p.ready is None else "not_ready")
        if state != "no_answer":
            streak[p.protocol] = 0
        if state == "ready":
            counts[f"{p.protocol}:ready"] += 1
            continue
        covering = tally.windows.covering(p.at, p.at)
        excused = covering & ({WORKER_KILL, REDIS_KILL} if p.ready is False
                              else {WORKER_KILL, REDIS_KILL, BURST})  # fmt: skip
        if excused:
            counts[f"{p.protocol}:{state} in {','.join(sorted(excused))}"] += 1
            streak[p.protocol] = 0
            continue
        counts[f"{p.protocol}:{state}"] += 1
        if p.ready is False:
            tally.find("not_ready_outside_kill", f"{p.protocol}: {p.detail}", p.at)
            continue
        streak[p.protocol] += 1
        if streak[p.protocol] == UNANSWERED_STREAK:
            tally.find(
                "readiness_unanswered",
                f"{p.protocol}: {UNANSWERED_STREAK} probes in a row unanswered: {p.detail}",
                p.at,
            )
    return dict(counts)


def summary(result: dict[str, Any]) -> str:
    """The printed report: requests by model and protocol, faults, errors by kind, slopes."""
    lines = [f"soak: {result['duration_s']:.0f} s against inferd serve --workers 2 "
             f"(warm-up {result['warmup_s']:.0f} s, seed {result['seed']})", ""]  # fmt: skip
    lines.append("valid requests (model, way: outcome count)")
    by: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for key, n in result["requests"].items():
        model, mode, outcome = key.split("|")
        by[(model, mode)][outcome] += n
    for (model, mode), outcomes in sorted(by.items()):
        parts = ", ".join(f"{o} {n}" for o, n in sorted(outcomes.items()))
        lines.append(f"  {model:<16} {mode:<14} {parts}")
    lines.append(f"  total {result['valid_total']}, ok {result['valid_ok']}")
    lines.append(f"refused inside fault windows: {result['refused'] or 'none'}")
    lines.append(f"versions answered: {result['versions']}")
    lines.append("")
    lines.append("faults injected")
    for event in result["events"]:
        lines.append(f"  t={event['t']:>7.1f}s {event['what']}")
    lines.append(f"bursts: {result['bursts']}")
    lines.append("")
    hostile: dict[str, list[str]] = defaultdict(list)
    for key, n in result["hostile"].items():
        kind, got = key.split("|")
        hostile[kind].append(f"{got} {n}")
    lines.append(f"invalid and hostile requests: {sum(result['hostile'].values())}")
    for kind, answers in sorted(hostile.items()):
        lines.append(f"  {kind:<28} {', '.join(answers)}")
    lines.append(f"slow clients: {result['slow']} (longest held, s: {result['slow_held_s']})")
    lines.append(f"readiness probes: {result['readiness']}")
    m = result["metrics"]
    lines.append(f"server failures by reason: {m['failures_by_reason']}; "
                 f"worker restarts {m['worker_restarts']}")  # fmt: skip
    lines.append(f"shared cache (Redis tier): {m['cache']}")
    lines.append(f"samples exported by /metrics: {m['exported_samples']}")
    lines.append("")
    lines.append("processes after warm-up (RSS MiB/h, fds/h, threads/h; least squares; fds count"
                 " no open client connection, shown apart as clients)")  # fmt: skip
    for row in result["processes"]:
        if row["judged"]:
            lines.append(
                f"  {row['role']:<16} pid {row['pid']:<7} RSS {row['rss_mib_window'][0]:>7.1f} -> "
                f"{row['rss_mib_window'][1]:>7.1f} MiB  {row['rss_mib_per_h']:+8.1f} MiB/h  "
                f"fds {row['fds_window']} {row['fds_per_h']:+.1f}/h  "
                f"threads {row['threads_window']} {row['threads_per_h']:+.1f}/h  "
                f"clients {row['client_connections_window']}"
            )
        else:
            lines.append(f"  {row['role']:<16} pid {row['pid']:<7} not judged: {row['why_not']}")
    lines.append(f"bounds: {result['bounds']}")
    lines.append(
        f"server log: {result['log_counts']}; exit status on SIGTERM {result['server_exit']}"
    )
    lines.append("")
    if result["findings"]:
        lines.append("FAILED: findings by kind")
        for kind, n in sorted(result["findings"].items()):
            lines.append(f"  {kind}: {n}")
            for example in result["examples"].get(kind, []):
                lines.append(f"      {example}")
    else:
        lines.append("PASSED")
    return "\n".join(lines)
