"""The soak, all faults at once (issue 34; docs/reliability.md, "The soak"), for three
minutes: benchmarks/soak.py run as a user runs it, which must pass, and must have done what
it says (every model answered over every way, every fault injected, every kind of hostile
request sent). Its memory bounds are scaled to three minutes: a least-squares slope over
2 minutes 15 s is noisy, so each bound is the growth a real leak would show there
(`SHORT_BOUNDS`), not the 30-minute run's.

Beside it, the soak's judgement is tested on its own, fast: a wrong answer, an answer of a
version that may no longer answer, a refusal outside a fault's window, readiness lost
outside a kill and memory that grows each fail the run; their allowed counterparts do not.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.soak_hostile import SLOW_KINDS, kinds
from tests.support.soak_plan import BURST, REDIS_KILL, WORKER_KILL, VersionBook, Windows
from tests.support.soak_references import Case, Cases, References
from tests.support.soak_report import (
    Bounds,
    Tally,
    judge_processes,
    judge_readiness,
    judge_series,
)
from tests.support.soak_report import process_report as report_of
from tests.support.soak_repository import write_repository
from tests.support.soak_requests import MODES, Answer
from tests.support.soak_watch import (
    Probe,
    ProcessSeries,
    client_connections,
    increase,
    read_process,
    slope_per_hour,
)

ROOT = Path(__file__).resolve().parents[3]
SOAK_S = 180
# Per hour, over the 135 s after warm-up. A slope over two minutes moves with warm-up (a
# worker's RSS rose 11 MiB there in a clean CI run, 304 MiB/h; a model first served by a
# worker after its sibling's kill adds its series, 2279 samples/h), so these bounds catch
# gross growth only: 600 MiB/h is 22 MiB (a 10 KiB leak per request at the soak's rate);
# 600 fds/h is 22 descriptors; 120 threads/h is 4.5 threads; 6000 samples/h is 225 (the
# series of unloaded versions kept, the leak this bound was set for, read 9,494/h). The
# 30-minute run (benchmarks/soak.py's own defaults) holds the tight bounds.
SHORT_BOUNDS = ("--max-rss-slope-mib-h", "600", "--max-fd-slope-h", "600",
                "--max-thread-slope-h", "120", "--max-series-slope-h", "6000")  # fmt: skip


@pytest.mark.soak
def test_the_soak_passes_for_three_minutes(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--duration-s", str(SOAK_S),
               "--json", str(out), *SHORT_BOUNDS]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=SOAK_S + 600)
    assert run.returncode == 0, f"the soak failed:\n{run.stdout[-12000:]}\n{run.stderr[-3000:]}"
    result = json.loads(out.read_text())

    ok = {tuple(k.split("|")[:2]) for k, n in result["requests"].items() if k.endswith("|ok")}
    assert ok == {(model, mode) for model, modes in MODES.items() for mode in modes}
    assert {k.split("|")[0] for k in result["hostile"]} == {k.name for k in kinds()}
    assert {k.split("|")[0] for k in result["slow"]} == {k.name for k in SLOW_KINDS}
    events = " ".join(e["what"] for e in result["events"])
    for done in ("hot swap: linear_noconfig", "hot swap: text_stats", "canary:",
                 "canary promoted", "canary rolled back", "burst over", "Redis restarted",
                 "worker restarted"):  # fmt: skip
        assert done in events, f"{done!r} did not happen: {result['events']}"
    assert {w["kind"] for w in result["windows"]} == {BURST, REDIS_KILL, WORKER_KILL}
    assert result["versions"].get("mlp v2", 0) > 0  # the canary answered
    # Every burst was sent and answered (200, or 429 past capacity: whether the host sheds
    # one depends on how fast it drains the queue that moment, so neither is required).
    assert result["bursts"] and all(sum(b["statuses"].values()) > 0 for b in result["bursts"])
    judged = [p for p in result["processes"] if p["judged"]]
    assert {"supervisor", "worker"} <= {p["role"] for p in judged}


# -- the judgement, on its own -------------------------------------------------------------


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cases]:
    repo = tmp_path_factory.mktemp("soak") / "repo"
    write_repository(repo)
    yield Cases(References(repo), seed=1)


def _right(cases: Cases, case: Case, version: str = "1") -> dict[str, np.ndarray]:
    """The model's answer, computed the way the soak computes what it expects."""
    refs = cases.refs
    x = next(iter(case.inputs.values()))[0]
    if case.model in ("mlp", "mlp_torch"):
        return refs.mlp_outputs(version, x)
    if case.model == "linear_noconfig":
        return {"y": refs.linear(int(version), x)}
    if case.model == "text_stats":
        return {"upper": np.array([[t.upper().encode()] for t in case.texts], dtype=object),
                "length": np.array([[len(t)] for t in case.texts], np.int32)}  # fmt: skip
    if case.model == "add_sub":
        b = case.inputs["INPUT1"][0]
        return {"OUTPUT0": x + b, "OUTPUT1": x - b}
    if case.model == "recall_rank":
        ids, scores, _ = refs.recall_rank(x)
        return {"IDS": ids, "SCORES": scores}
    return {"text_output": np.array([w.encode() for w in case.texts], dtype=object)}


def _wronged(model: str, right: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in right.items()}
    if model in ("mlp", "mlp_torch"):
        out["probabilities"][0, 0] += 1e-2
    elif model == "linear_noconfig":
        out["y"][0, 0] += 1e-3
    elif model == "text_stats":
        out["length"][0, 0] += 1
    elif model == "add_sub":
        out["OUTPUT1"] = np.nextafter(out["OUTPUT1"], np.float32(np.inf))
    elif model == "recall_rank":
        out["IDS"][0, [0, 1]] = out["IDS"][0, [1, 0]]
    else:
        out["text_output"] = out["text_output"][:-1]
    return out


@pytest.mark.parametrize("model", [m for m in MODES if m != "text_stats_raw"])
def test_a_wrong_answer_is_told_from_a_right_one(cases: Cases, model: str) -> None:
    for _ in range(5):
        case = cases.make(model)
        right = _right(cases, case)
        assert cases.check(case, "1", right) is None
        assert cases.check(case, "1", _wronged(model, right)) is not None


def test_an_answer_is_checked_against_the_version_that_gave_it(cases: Cases) -> None:
    mlp = cases.make("mlp")
    assert cases.check(mlp, "2", cases.refs.mlp_outputs("2", mlp.inputs["input"][0])) is None
    assert cases.check(mlp, "2", cases.refs.mlp_outputs("1", mlp.inputs["input"][0])) is not None
    assert cases.check(mlp, "3", cases.refs.mlp_outputs("1", mlp.inputs["input"][0])) is not None
    linear = cases.make("linear_noconfig")
    x = linear.inputs["x"][0]
    assert cases.check(linear, "3", {"y": cases.refs.linear(3, x)}) is None
    assert cases.check(linear, "3", {"y": cases.refs.linear(2, x)}) is not None


def test_old_versions_answer_only_within_the_grace() -> None:
    book = VersionBook(grace_s=10)
    book.set("m", {"2"}, at=100.0)
    assert book.allowed("m", "1", sent=105.0, answered=106.0)  # within the grace
    assert not book.allowed("m", "1", sent=111.0, answered=111.5)  # past it
    assert not book.allowed("m", "2", sent=98.0, answered=99.0)  # before it was written
    assert book.allowed("m", "2", sent=99.0, answered=101.0)
    assert book.allowed("other", "1", sent=1e6, answered=1e6)
    assert book.deployed(until=200.0) == [("m", "2", 100.0, 200.0)]


def _tally() -> tuple[Tally, Windows]:
    windows = Windows()
    return Tally(windows, VersionBook(grace_s=10), started=time.monotonic()), windows


def test_refusals_are_allowed_only_inside_their_windows() -> None:
    tally, windows = _tally()
    now = time.monotonic()
    tally.answer("mlp", "grpc", Answer("UNAVAILABLE"), None, now, now)
    tally.answer("mlp", "http_json", Answer("lost"), None, now, now)
    burst = windows.open(BURST)
    tally.answer("mlp", "http_json", Answer("429"), None, now, now + 1)
    tally.answer("mlp", "http_json", Answer("lost"), None, now, now + 1)
    tally.answer("mlp", "http_json", Answer("500"), None, now, now + 1)
    windows.close(burst)
    kill = windows.open(WORKER_KILL)
    later = now + 60  # past the burst's window and its margin
    tally.answer("mlp", "http_json", Answer("lost"), None, later, later)
    windows.close(kill)
    right = Answer("200", "1", {"y": np.zeros(1)})
    tally.answer("mlp", "http_json", right, "values differ by up to 0.1", now, now)
    tally.answer("mlp", "http_json", Answer("200", "7", {"y": np.zeros(1)}), None, now, now)
    assert dict(tally.findings) == {
        "unavailable_outside_fault": 1, "connection_lost_outside_kill": 2, "server_error": 1,
        "wrong_answer": 1, "stale_version": 1,
    }  # fmt: skip
    assert dict(tally.refused) == {("burst", "429"): 1, ("worker_kill", "lost"): 1}


def test_hostile_answers_are_held_to_their_kind() -> None:
    tally, windows = _tally()
    now = time.monotonic()
    tally.hostile_answer("json_garbage", "400", frozenset({"400"}), now)
    tally.hostile_answer("x6", "400,500", frozenset({"400", "500"}), now)
    tally.hostile_answer("json_garbage", "500", frozenset({"400"}), now)
    tally.hostile_answer("json_garbage", "lost", frozenset({"400"}), now)
    windows.open(WORKER_KILL)
    tally.hostile_answer("json_garbage", "lost", frozenset({"400"}), time.monotonic())
    assert dict(tally.findings) == {"hostile_unexpected_answer": 2}


def test_readiness_lost_outside_a_kill_fails() -> None:
    tally, windows = _tally()
    now = time.monotonic()
    probes = [Probe(now, "http", True), Probe(now, "grpc", False, "ServerReady false"),
              Probe(now, "http", None, "timed out"), Probe(now, "http", True)]  # fmt: skip
    probes += [Probe(now, "grpc", None, "no answer")] * 3  # a streak: the server is silent
    kill = windows.open(WORKER_KILL)
    probes.append(Probe(time.monotonic(), "http", False, "503"))
    windows.close(kill)
    counts = judge_readiness(tally, probes)
    assert dict(tally.findings) == {"not_ready_outside_kill": 1, "readiness_unanswered": 1}
    assert counts["http:not_ready in worker_kill"] == 1
    assert counts["http:no_answer"] == 1  # one probe a loaded host missed: counted only


def test_growth_after_warm_up_fails_and_a_restarted_process_warms_up_first() -> None:
    bounds = Bounds(rss_mib_h=32, fds_h=64, threads_h=8)
    flat = ProcessSeries(1, "worker", first_seen=0.0, started=1)
    leaking = ProcessSeries(2, "worker", first_seen=0.0, started=2)
    young = ProcessSeries(3, "worker", first_seen=500.0, started=3)
    for t in range(0, 601, 5):
        noise = 2048 * ((t // 5) % 3)  # +-2 MiB of noise, no trend
        flat.samples.append((t, 300 * 1024 + noise, 40 + (t // 5) % 7, 27, 6))
        leaking.samples.append((t, 300 * 1024 + t * 20, 40, 27, 6))  # 20 KiB/s: 70 MiB/h
        if t >= 500:
            young.samples.append((t, 30 * 1024 + (t - 500) * 3000, 10, 2, 0))  # starting up
    tally, _ = _tally()
    rows = [report_of(s, since=120.0, until=600.0, warmup_s=120.0, bounds=bounds)
            for s in (flat, leaking, young)]  # fmt: skip
    judge_processes(tally, rows, bounds, at=600.0)
    assert dict(tally.findings) == {"rss_growth": 1}
    assert "pid 2" in tally.examples["rss_growth"][0]
    assert not rows[2]["judged"]
    assert slope_per_hour([(0, 0), (1800, 16)]) == pytest.approx(32)


def test_open_client_connections_are_counted_apart_and_one_left_half_closed_is_not() -> None:
    """A worker's accepted keep-alive connections are its clients' (they move to a survivor
    when a sibling is killed); one the client closed and the server kept is a server leak."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        before = read_process(os.getpid(), client_connections({port}))
        assert before is not None
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        with accepted:
            during = read_process(os.getpid(), client_connections({port}))
            assert during is not None
            assert during[3] == before[3] + 1  # the accepted one: a client's connection
            assert during[1] == before[1] + 1  # the client's own end is this process's too
            client.close()  # the server end is now half closed (CLOSE_WAIT): the server's
            after = read_process(os.getpid(), client_connections({port}))
            assert after is not None
            assert (after[1], after[3]) == (before[1] + 1, before[3])


def test_a_killed_process_not_yet_reaped_gives_no_sample() -> None:
    """A zombie has no memory and no descriptors: read as a sample, its zeros would drag a
    growing process's slope down (a leak hidden by the kill that ends it)."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert read_process(child.pid) is not None
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, left unreaped
        assert read_process(child.pid) is None
    finally:
        child.wait()


def test_counter_increases_survive_a_restarted_worker() -> None:
    series = [(0.0, 5.0), (10.0, 9.0), (20.0, 2.0), (30.0, 4.0)]  # reset at 20 s
    assert increase(series) == 4 + 2 + 2
    assert increase(series, skip=lambda t0, t1: t0 >= 10) == 4


def test_exported_series_that_keep_growing_fail_and_a_restart_is_not_growth() -> None:
    bounds = Bounds(rss_mib_h=32, fds_h=64, threads_h=8, series_h=200)
    steady = [(float(t), 3000 + (t // 10) % 2 * 113) for t in range(0, 601, 10)]  # swaps
    growing = [(float(t), 3000 + 113 * (t // 60)) for t in range(0, 601, 10)]  # 6780/h
    # Restarted at 400 s: its series come back as its models are asked again.
    restarted = [(float(t), 3000 if t < 400 else min(300 + 30 * (t - 400), 3000))
                 for t in range(0, 601, 10)]  # fmt: skip
    tally, _ = _tally()
    report = judge_series(tally, {"0": steady, "1": restarted}, 120.0, 600.0, 120.0, bounds)
    assert not tally.findings
    assert report["1"]["window"] == [3000, 3000]  # the stretch before the restart
    judge_series(tally, {"0": growing}, 120.0, 600.0, 120.0, bounds)
    assert dict(tally.findings) == {"metrics_series_growth": 1}
