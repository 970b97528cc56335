"""What drift monitoring costs: the example MLP (64 -> 1024 -> 1024 -> 16) with and without
it, in one server, loaded in turn by `inferd bench` at 64 connections over HTTP.

    .venv/bin/python benchmarks/drift_cost.py --rounds 6 --duration-s 10

`mlp` is the example model as shipped, `mlp_copy` an identical second copy (the A/A
control: how far two identical models differ in this run is its noise), `mlp_drift` the
same model with a reference.npz of 5,000 rows beside it (its input, uniform in [0, 1) as
`inferd bench` sends, and a `label` column of random classes, tested as a class output)
and the default drift settings (every batch sampled, windows of 1,000 rows, 64 columns, a
CPU budget of 2% of a core). Each round runs the three in turn, the order rotating, in one
server process, so that a change in the machine's load hits all three. Per run: the
throughput, p99, the server's CPU time per request (from /proc, over the requests the
server counted), and for mlp_drift the CPU its monitor's thread spent per request
(inferd_drift_cpu_seconds_total).
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

from tests.support.models import builders  # noqa: E402  (the example models' builder)
from tests.support.server_process import free_port, wait_until_serving  # noqa: E402

from inferd.monitoring.reference import npz_bytes  # noqa: E402

MODELS = ("mlp", "mlp_copy", "mlp_drift")


def build(repo: Path) -> None:
    example = ROOT / "examples" / "models" / "mlp" / "config.pbtxt"
    for name in MODELS:
        builders._save(builders.mlp([64, 1024, 1024, 16], seed=0), repo / name / "1" / "model.onnx")
        config = example.read_text(encoding="utf-8").replace('name: "mlp"', f'name: "{name}"')
        (repo / name / "config.pbtxt").write_text(config, encoding="utf-8")
    rng = np.random.default_rng(0)
    reference = {
        "input": rng.random((5000, 64)).astype(np.float32),
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


def scrape(metrics_port: int) -> dict[str, float]:
    """Sample line (name and labels) -> value."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


def counter(samples: dict[str, float], name: str, model: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(f'{name}{{model="{model}",'))


def cpu_s(pid: int) -> float:
    """The server process's CPU time (user + system, all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    build(tmp / "models")
    port, metrics_port = free_port(), free_port()
    server = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "inferd"),
            "serve",
            "--model-repository",
            str(tmp / "models"),
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
    # model -> [(infer/s, p99 ms, server CPU µs/request, monitor CPU µs/request)]
    runs: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in MODELS}
    try:
        wait_until_serving(server.pid, port, exit_code=server.poll)
        for round_ in range(args.rounds):
            order = MODELS[round_ % 3 :] + MODELS[: round_ % 3]
            for model in order:
                before, cpu0 = scrape(metrics_port), cpu_s(server.pid)
                throughput, p99 = bench(port, model, args.duration_s, tmp / "run.csv")
                after, cpu1 = scrape(metrics_port), cpu_s(server.pid)
                n = max(
                    counter(after, "inferd_request_success_total", model)
                    - counter(before, "inferd_request_success_total", model),
                    1,
                )
                monitor = counter(after, "inferd_drift_cpu_seconds_total", model) - counter(
                    before, "inferd_drift_cpu_seconds_total", model
                )
                runs[model].append((throughput, p99, (cpu1 - cpu0) / n * 1e6, monitor / n * 1e6))
            print(
                f"round {round_ + 1}: "
                + " | ".join(
                    f"{m} {runs[m][-1][0]:,.0f} infer/s p99 {runs[m][-1][1]:.1f} ms "
                    f"{runs[m][-1][2]:.0f} µs CPU/req"
                    for m in MODELS
                )
                + f" | monitor {runs['mlp_drift'][-1][3]:.1f} µs CPU/req",
                flush=True,
            )
        final = scrape(metrics_port)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    for name, pick in (("mean", statistics.mean), ("median", statistics.median)):
        t = {m: pick(r[0] for r in runs[m]) for m in MODELS}
        c = {m: pick(r[2] for r in runs[m]) for m in MODELS}
        control_t, control_c = (t["mlp"] + t["mlp_copy"]) / 2, (c["mlp"] + c["mlp_copy"]) / 2
        print(
            f"{name}: infer/s mlp {t['mlp']:,.0f}, mlp_copy {t['mlp_copy']:,.0f} "
            f"(A/A {(t['mlp_copy'] - t['mlp']) / t['mlp']:+.1%}), mlp_drift "
            f"{t['mlp_drift']:,.0f} ({(t['mlp_drift'] - control_t) / control_t:+.1%} vs the "
            f"controls' mean); server CPU µs/request {c['mlp']:.0f}, {c['mlp_copy']:.0f}, "
            f"{c['mlp_drift']:.0f} ({(c['mlp_drift'] - control_c) / control_c:+.1%}); the "
            f"monitor's thread {pick(r[3] for r in runs['mlp_drift']):.1f} µs/request"
        )
    print(
        "drift monitor: "
        + ", ".join(
            f"{k} {counter(final, f'inferd_drift_{k}_total', 'mlp_drift'):,.0f}"
            for k in ("samples", "samples_dropped")
        )
    )


if __name__ == "__main__":
    main()
