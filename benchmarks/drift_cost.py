"""What drift monitoring costs in throughput: the example MLP (64 -> 1024 -> 1024 -> 16) with
and without it, in one server, loaded in turn by `inferd bench` at 64 connections over HTTP.

    .venv/bin/python benchmarks/drift_cost.py --rounds 3 --duration-s 10

`mlp` is the example model as shipped; `mlp_drift` is the same model with a reference.npz of
5,000 rows beside it (its input, uniform in [0, 1) as `inferd bench` sends, and a `label`
column of random classes, tested as a class output) and the default drift settings (every
batch sampled, windows of 1,000 rows, 64 columns, a CPU budget of 2% of a core). Rounds
alternate off/on in one server process (off first in odd rounds, on first in even ones) so
that a change in the machine's load hits both; the report gives each round, the means and
the medians, the server's CPU time per request (from /proc, over the requests the server
counted), and the drift monitor's own counts (batches tested, dropped, windows).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.models import builders  # noqa: E402  (the example models' builder)
from tests.server_process import free_port, wait_until_serving  # noqa: E402

from inferd.monitoring.reference import npz_bytes  # noqa: E402


def build(repo: Path) -> None:
    example = ROOT / "examples" / "models" / "mlp" / "config.pbtxt"
    for name in ("mlp", "mlp_drift"):
        builders._save(builders.mlp([64, 1024, 1024, 16], seed=0), repo / name / "1" / "model.onnx")
        config = example.read_text(encoding="utf-8").replace('name: "mlp"', f'name: "{name}"')
        (repo / name / "config.pbtxt").write_text(config, encoding="utf-8")
    rng = np.random.default_rng(0)
    reference = {
        "input": rng.random((5000, 64)).astype(np.float32),  # what `inferd bench` sends
        "label": rng.integers(0, 16, (5000, 1)),
    }
    (repo / "mlp_drift" / "1" / "reference.npz").write_bytes(npz_bytes(reference))
    with (repo / "mlp_drift" / "config.pbtxt").open("a", encoding="utf-8") as config:
        config.write('parameters { key: "drift_class_outputs" value: { string_value: "label" } }\n')


def bench(port: int, model: str, duration_s: float, out: Path) -> tuple[float, float]:
    """(infer/s, p99 ms) of one run."""
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "inferd"),
            "bench",
            "-m",
            model,
            "-u",
            f"127.0.0.1:{port}",
            "--concurrency",
            "64",
            "--warmup-s",
            "2",
            "--duration-s",
            str(duration_s),
            "--csv",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    with out.open(encoding="utf-8") as f:
        (row,) = list(csv.DictReader(f))
    return float(row["infer_per_s"]), float(row["p99_ms"])


def scrape(metrics_port: int) -> str:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback)
        return str(response.read().decode())


def successes(metrics_port: int, model: str) -> float:
    prefix = f'inferd_request_success_total{{model="{model}",'
    for line in scrape(metrics_port).splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def cpu_s(pid: int) -> float:
    """The server process's CPU time (user + system, all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drift_counts(metrics_port: int) -> dict[str, float]:
    text = scrape(metrics_port)
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("samples_total", "samples_dropped_total", "windows_total"):
            if line.startswith(f"inferd_drift_{name}{{") and 'tensor="label"' not in line:
                counts[name] = float(line.rsplit(" ", 1)[1])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build(repo)
        port, metrics_port = free_port(), free_port()
        server = subprocess.Popen(
            [
                str(ROOT / ".venv" / "bin" / "inferd"),
                "serve",
                "--model-repository",
                str(repo),
                "--http-port",
                str(port),
                "--grpc-port",
                "0",
                "--metrics-port",
                str(metrics_port),
                "--log-level",
                "WARNING",
            ]
        )
        try:
            wait_until_serving(server.pid, port, exit_code=server.poll)
            figures: dict[str, list[tuple[float, float]]] = {"mlp": [], "mlp_drift": []}
            # Server CPU per request: what the monitor costs, much less swayed than the
            # throughput by what else the machine runs.
            cpu_us: dict[str, list[float]] = {"mlp": [], "mlp_drift": []}
            for round_ in range(1, args.rounds + 1):
                # Which goes first alternates too: a trend in the machine's load within a
                # round would otherwise favour the second.
                order = ("mlp", "mlp_drift") if round_ % 2 else ("mlp_drift", "mlp")
                for model in order:
                    out = Path(tmp) / f"{model}-{round_}.csv"
                    cpu0, n0 = cpu_s(server.pid), successes(metrics_port, model)
                    figures[model].append(bench(port, model, args.duration_s, out))
                    cpu1, n1 = cpu_s(server.pid), successes(metrics_port, model)
                    cpu_us[model].append((cpu1 - cpu0) / max(n1 - n0, 1) * 1e6)
                off, on = figures["mlp"][-1], figures["mlp_drift"][-1]
                print(
                    f"round {round_}: off {off[0]:,.0f} infer/s p99 {off[1]:.1f} ms "
                    f"{cpu_us['mlp'][-1]:.0f} µs CPU/request | on {on[0]:,.0f} infer/s "
                    f"p99 {on[1]:.1f} ms {cpu_us['mlp_drift'][-1]:.0f} µs CPU/request",
                    flush=True,
                )
            counts = drift_counts(metrics_port)
        finally:
            server.terminate()
            server.wait(timeout=30)
    for name, pick in (("mean", statistics.mean), ("median", statistics.median)):
        off = pick(t for t, _ in figures["mlp"])
        on = pick(t for t, _ in figures["mlp_drift"])
        print(f"{name}: off {off:,.0f}, on {on:,.0f} infer/s: cost {(off - on) / off:+.1%}")
        off, on = pick(cpu_us["mlp"]), pick(cpu_us["mlp_drift"])
        print(f"{name}: server CPU off {off:.0f}, on {on:.0f} µs/request: {(on - off) / off:+.1%}")
    print("drift monitor (input): " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(counts.items())))
    shutil.rmtree(Path(tmp), ignore_errors=True)


if __name__ == "__main__":
    main()
