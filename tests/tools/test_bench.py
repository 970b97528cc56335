"""`inferd bench` against real inferd servers, run as a user runs it (its own process).

Every case is bounded to a second or two of load; assertions are on counts and structure,
never on how fast this machine is, except the open-loop case, whose point is that latency
grows far past the model's 40 ms when requests are sent faster than it can serve them.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import RunningServer

SHORT = ("--warmup-s", "0.2", "--duration-s", "1")


def bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "result.json"
    out.unlink(missing_ok=True)
    raw = subprocess.run(
        [sys.executable, "-m", "inferd", "bench", *args, "--json", str(out)],
        capture_output=True,
        timeout=120,
    )
    # Decoded by hand: text mode would turn the progress line's carriage returns into "\n".
    proc = subprocess.CompletedProcess(
        raw.args, raw.returncode, raw.stdout.decode(), raw.stderr.decode()
    )
    doc = json.loads(out.read_text()) if out.exists() else {}
    return proc, doc


def assert_sane_latencies(level: dict[str, Any]) -> None:
    lat = level["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
    assert lat["p99"] <= lat["p99.9"] <= lat["max"]


@pytest.mark.parametrize(
    "protocol_args",
    [["-i", "http"], ["-i", "http", "--http-binary"], ["-i", "grpc"]],
    ids=["http-json", "http-binary", "grpc"],
)
def test_closed_loop_completes_without_errors(
    server: RunningServer, tmp_path: Path, protocol_args: list[str]
) -> None:
    url = server.grpc_address if "grpc" in protocol_args else server.url
    proc, doc = bench(
        tmp_path, "-m", "mlp", "-u", url, "--concurrency", "1,4", *protocol_args, *SHORT
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["encoding"] == {"http": "json", "http-binary": "binary", "grpc": "raw"}[
        "grpc" if "grpc" in protocol_args else
        "http-binary" if "--http-binary" in protocol_args else "http"
    ]  # fmt: skip
    assert doc["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 8]}]
    assert [(lv["mode"], lv["value"]) for lv in doc["levels"]] == [
        ("concurrency", 1),
        ("concurrency", 4),
    ]
    for level in doc["levels"]:
        assert level["errors"] == {}
        assert level["successes"] > 0 and level["throughput"] > 0
        assert level["completed"] == level["successes"]
        assert_sane_latencies(level)
        # The server-side split, from inferd's statistics (deltas over the window).
        split = level["server"]
        assert split is not None and split["requests"] > 0
        for key in ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us"):
            assert split[key] is not None and split[key] >= 0
        assert split["avg_batch"] >= 1
    assert "concurrency" in proc.stdout and "p99 ms" in proc.stdout
    assert "server side, per request" in proc.stdout


def test_worker_processes_merge_their_samples(server: RunningServer, tmp_path: Path) -> None:
    proc, doc = bench(
        tmp_path, "-m", "mlp", "-u", server.url, "--concurrency", "4", "--processes", "2", *SHORT
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["processes"] == 2
    assert "in 2 worker processes" in proc.stdout
    (level,) = doc["levels"]
    assert level["errors"] == {} and level["successes"] > 0
    assert_sane_latencies(level)


def test_open_loop_sends_the_intended_count(server: RunningServer, tmp_path: Path) -> None:
    proc, doc = bench(
        tmp_path, "-m", "counter", "-u", server.url, "--shape", "IN:1",
        "--request-rate", "50", "--warmup-s", "0.2", "--duration-s", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (level,) = doc["levels"]
    assert level["mode"] == "request_rate" and level["value"] == 50
    assert 70 <= level["sent"] <= 130  # 50/s for 2 s, ±30%
    assert 70 <= level["successes"] <= 130
    assert level["errors"] == {}
    assert_sane_latencies(level)


def test_open_loop_poisson_runs(server: RunningServer, tmp_path: Path) -> None:
    proc, doc = bench(
        tmp_path, "-m", "counter", "-u", server.url, "--shape", "IN:1",
        "--request-rate", "50", "--poisson", "--processes", "2", *SHORT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (level,) = doc["levels"]
    assert 20 <= level["sent"] <= 90 and level["errors"] == {}


def test_open_loop_counts_latency_from_the_intended_send_time(
    server: RunningServer, tmp_path: Path
) -> None:
    """slow_counter takes 40 ms a batch; with at most 2 requests in flight it serves about
    50/s. Asked for 200/s, requests queue in the client, and since latency counts from each
    request's intended send time the queueing shows: far beyond the 40 ms a lone request
    takes (a closed-loop generator would report ~40-80 ms here: coordinated omission)."""
    proc, doc = bench(
        tmp_path, "-m", "slow_counter", "-u", server.url, "--shape", "IN:1",
        "--request-rate", "200", "--max-connections", "2",
        "--warmup-s", "0", "--duration-s", "1.5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (level,) = doc["levels"]
    assert level["errors"] == {}
    assert level["sent"] > 2 * level["completed"]  # it fell behind the schedule
    assert level["latency_ms"]["p50"] > 200
    assert level["latency_ms"]["p99"] > 400


def test_errors_are_counted_by_status(server: RunningServer, tmp_path: Path) -> None:
    data = tmp_path / "negative.json"
    data.write_text(json.dumps({"IN": [-1.0, -2.0, -3.0, -4.0]}))
    for protocol, url, status in (
        ("http", server.url, "500"),
        ("grpc", server.grpc_address, "INTERNAL"),
    ):
        proc, doc = bench(
            tmp_path, "-m", "faulty", "-u", url, "-i", protocol, "--input-data", str(data),
            "--concurrency", "2", *SHORT,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (level,) = doc["levels"]
        assert level["successes"] == 0
        assert set(level["errors"]) == {status} and level["errors"][status] > 0
        assert level["completed"] == level["errors"][status]
        assert all(v is None or math.isnan(v) for v in (level["latency_ms"]["p50"],))
        assert f"{status}: " in proc.stdout


def test_unknown_model_fails_fast_with_a_clear_error(server: RunningServer, tmp_path: Path) -> None:
    for protocol, url in (("http", server.url), ("grpc", server.grpc_address)):
        proc, doc = bench(tmp_path, "-m", "no_such_model", "-u", url, "-i", protocol)
        assert proc.returncode == 2
        assert doc == {}
        assert "no_such_model" in proc.stderr
        assert "404" in proc.stderr or "NOT_FOUND" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_unreachable_server_and_bad_options_are_clear(
    server: RunningServer, tmp_path: Path
) -> None:
    from tests.support.servers import free_port

    proc, _ = bench(tmp_path, "-m", "mlp", "-u", f"127.0.0.1:{free_port()}")
    assert proc.returncode == 2 and "cannot reach the server" in proc.stderr
    proc, _ = bench(tmp_path, "-m", "counter", "-u", server.url)  # IN is [-1, -1]
    assert proc.returncode == 2 and "--shape IN:" in proc.stderr
    proc, _ = bench(tmp_path, "-m", "mlp", "-u", server.url, "--concurrency", "4:1:x0")
    assert proc.returncode == 2 and "expected a list" in proc.stderr


def test_stability_windows_and_progress_line(server: RunningServer, tmp_path: Path) -> None:
    proc, doc = bench(
        tmp_path, "-m", "mlp", "-u", server.url, "--warmup-s", "0.2", "--window-s", "0.5",
        "--stability-percentage", "1000", "--max-windows", "5", "--progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (level,) = doc["levels"]
    # Any three windows are within 1000% of their mean: stable after exactly three.
    assert level["windows"] == 3 and level["stable"] is True
    assert len(level["window_throughputs"]) == 3
    assert "\r" in proc.stderr and "window 3" in proc.stderr


def test_csv_json_and_plot_outputs(server: RunningServer, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out_csv, plot = tmp_path / "out.csv", tmp_path / "out.png"
    proc, doc = bench(
        tmp_path, "-m", "mlp", "-u", server.url, "--concurrency", "1:4:x2", *SHORT,
        "--csv", str(out_csv), "--plot", str(plot),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with out_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["value"]) for r in rows] == [1, 2, 4]
    for row in rows:
        for field in ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99.9_ms"):
            assert float(row[field]) > 0
        assert row["error_count"] == "0" and row["mode"] == "concurrency"
        assert float(row["server_compute_infer_us"]) >= 0
    assert doc["config"]["model"] == "mlp" and doc["cores"] >= 1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_clear_error(tmp_path: Path) -> None:
    """Hide matplotlib from the child; the run must stop before loading anything."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "matplotlib.py").write_text("raise ImportError('hidden for the test')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "inferd", "bench", "-m", "mlp", "--plot", str(tmp_path / "p.png")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "PYTHONPATH": str(shim)},
    )
    assert proc.returncode == 2
    assert "needs matplotlib" in proc.stderr and "inferd[bench]" in proc.stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_ctrl_c_reports_and_saves_the_levels_measured(
    server: RunningServer, tmp_path: Path, processes: str
) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it, so worker
    processes get it too) stops the run; the levels finished by then are printed and
    written to the CSV and JSON, and the exit code is 130."""
    out_csv, out_json = tmp_path / "out.csv", tmp_path / "out.json"
    levels = list(range(1, 41))
    stderr = bytearray()
    with subprocess.Popen(
        [sys.executable, "-m", "inferd", "bench", "-m", "mlp", "-u", server.url,
         "--concurrency", ",".join(map(str, levels)), "--processes", processes,
         "--warmup-s", "0", "--duration-s", "0.3", "--progress",
         "--csv", str(out_csv), "--json", str(out_json)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    ) as proc:  # fmt: skip
        reader = threading.Thread(target=_read_all, args=(proc, stderr), daemon=True)
        reader.start()
        # The progress line names the level being measured: once level 3's first window
        # is reported, levels 1 and 2 are finished.
        deadline = time.monotonic() + 60
        while b"concurrency 3: window 1" not in stderr:
            assert proc.poll() is None, bytes(stderr).decode()
            assert time.monotonic() < deadline, bytes(stderr).decode()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)  # its stdout (the table) is far below a pipe's buffer
        reader.join(timeout=10)
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
    err = bytes(stderr).decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    with out_csv.open() as f:
        rows = list(csv.DictReader(f))
    finished = len(rows)
    assert 2 <= finished < len(levels), err
    assert [float(r["value"]) for r in rows] == levels[:finished]
    assert all(int(r["successes"]) > 0 and r["stable"] == "" for r in rows)
    doc = json.loads(out_json.read_text())
    assert doc["interrupted"] is True and len(doc["levels"]) == finished
    assert f"interrupted; reporting the {finished} level(s) measured so far" in err
    table_rows = [line.split()[0] for line in stdout.splitlines()[2 : 2 + finished]]
    assert table_rows == [str(v) for v in levels[:finished]], stdout


def _read_all(proc: subprocess.Popen[bytes], into: bytearray) -> None:
    assert proc.stderr is not None
    while chunk := proc.stderr.read1(4096):  # type: ignore[attr-defined]
        into.extend(chunk)
