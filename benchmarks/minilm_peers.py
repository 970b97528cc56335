"""The minilm service side by side: inferd's `minilm` ensemble against the same text ->
embedding service in Mosec, LitServe and MLServer (benchmarks/peers), and the in-process
ceilings (benchmarks/minilm_ceiling.py), over one fixed corpus (benchmarks/minilm_corpus.py,
2,000 sentences of 3-60 words, long-tailed).

Every server tokenises with `tokenizers` over the example's tokenizer.json (truncation at
128) and runs the example's ONNX encoder in ONNX Runtime with one intra-op thread, batching
up to 32 in one worker: inferd with its example config (`minilm_tokenize` -> `minilm_encoder`,
padding per batch with length grouping, no `--cache-config`: no response cache); the peers
with their documented dynamic batching (max batch 32, ~2 ms wait), each batch padded to its
longest in arrival order (benchmarks/peers/README.md).

Each round starts every server in turn (the order rotating round by round), checks its answer
to two sentences against ONNX Runtime run here (cosine > 0.999), warms it up (wrk, 64
connections, 2 s), then loads it with wrk (one thread, benchmarks/wrk/minilm_corpus.lua: one
sentence per request, through the corpus in order) at 64 and then 1 connection, and stops it;
then the ceilings run in process (ONNX Runtime alone: batch 1, batch 32 in arrival order,
batch 32 sorted by length, and the batches inferd's length grouping forms for 64 clients).
Per server and level: sentences/s, p50, p99 and the padding waste of the 64-connection run
(pad tokens per real token: inferd's from its statistics API, the entry's `padding` of
minilm_encoder; the peers' from their log line, common_models.MiniLM) and the rows per batch.
Prints every run, the medians over the rounds and the issue's ratios.

    .venv/bin/python benchmarks/minilm_peers.py [SECONDS per run] [ROUNDS]
        [--servers inferd,mosec,litserve,mlserver] [--json FILE]

Needs wrk, `make models` (the minilm example), benchmarks/peers/setup.sh mosec litserve
mlserver (each peer's venv).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from benchmarks.minilm_ceiling import WAYS, Encoder, batches, one_pass  # noqa: E402
from benchmarks.minilm_corpus import corpus  # noqa: E402
from tests.support.server_process import check_port_free, wait_until_serving  # noqa: E402

PEERS = HERE / "peers"
SCRIPT = HERE / "wrk" / "minilm_corpus.lua"
MODELS = ROOT / "examples" / "models"
CONNECTIONS = (64, 1)
PORT = 18960
CHECK = ["A man is playing a guitar.", "The stock market fell sharply today, and the city river"]
_PADDING = re.compile(
    r"minilm padding: batches (\d+) rows (\d+) real_tokens (\d+) padded_tokens (\d+)"
)
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if match is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(connections: int, seconds: float, corpus_file: Path) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "20s", "--latency"]
        + ["-s", str(SCRIPT), f"http://127.0.0.1:{PORT}/v2/models/minilm/infer"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "MINILM_CORPUS": str(corpus_file)},
    ).stdout
    errors = sum(
        int(n) for n in re.findall(r"(?:Non-2xx or 3xx responses|timeout|read|write): (\d+)", out)
    )
    found = {
        key: re.search(pattern, out)
        for key, pattern in (("rps", r"Requests/sec:\s+([\d.]+)"), ("p50", r"\s50%\s+(\S+)"),
                             ("p99", r"\s99%\s+(\S+)"))
    }  # fmt: skip
    if any(m is None for m in found.values()):
        raise RuntimeError(f"wrk's output lacks a figure:\n{out}")
    return {
        "rps": float(found["rps"].group(1)),  # type: ignore[union-attr]
        "p50": _ms(found["p50"].group(1)),  # type: ignore[union-attr]
        "p99": _ms(found["p99"].group(1)),  # type: ignore[union-attr]
        "errors": float(errors),
    }


def post(texts: list[str]) -> np.ndarray:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts), 1],
                        "data": texts}]}  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v2/models/minilm/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        output = json.loads(response.read())["outputs"][0]
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


class Server:
    """inferd or a peer on PORT; `padding()` reads its counters: batches, rows, real, padded."""

    def __init__(self, name: str, repo: Path, logs: Path) -> None:
        self.name, self.repo, self.logs = name, repo, logs
        self.pid = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.name == "inferd":
            check_port_free(PORT)
            log = self.logs / "inferd.log"
            command = [str(Path(sys.executable).parent / "inferd"), "serve"]
            command += ["--model-repository", str(self.repo), "--http-port", str(PORT)]
            command += ["--grpc-port", "0", "--metrics-port", "0", "--log-level", "WARNING"]
            with log.open("ab") as sink:
                self.process = subprocess.Popen(
                    command, start_new_session=True, stdout=sink, stderr=sink
                )
            self.pid = self.process.pid
            wait_until_serving(self.pid, PORT, "/v2/models/minilm/ready",
                               exit_code=self.process.poll, output=log.read_text,
                               timeout_s=120)  # fmt: skip
        else:
            out = subprocess.run(
                [str(PEERS / "run_peer.sh"), self.name, "minilm", str(PORT)],
                check=True,
                capture_output=True,
                text=True,
            )
            self.pid = int(out.stdout.split()[-1])

    def stop(self) -> None:
        if self.process is not None:
            os.killpg(self.pid, signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.process.wait()
            self.process = None
        else:
            subprocess.run([str(PEERS / "stop_peer.sh"), str(self.pid)], check=True,
                           capture_output=True)  # fmt: skip

    def padding(self) -> tuple[int, int, int, int]:
        # After a run the queued requests still drain (at 64 connections up to a second on
        # the slowest peer), and the peers log their totals once a second when they change:
        # wait for both, so neither the counts nor the next run take in the last run's tail.
        time.sleep(2.5)
        if self.name == "inferd":
            url = f"http://127.0.0.1:{PORT}/v2/models/minilm_encoder/stats"
            with urllib.request.urlopen(url, timeout=10) as response:
                entry = json.loads(response.read())["model_stats"][0]
            p = entry["padding"]
            rows = int(entry["inference_count"])
            return int(p["batches"]), rows, int(p["real_elements"]), int(p["padded_elements"])
        log = PEERS / "results" / "logs" / f"{self.name}-minilm-{PORT}.log"
        found = _PADDING.findall(log.read_text(errors="replace"))
        if not found:
            return 0, 0, 0, 0
        b, r, real, padded = (int(x) for x in found[-1])
        return b, r, real, padded


def build_repository(into: Path) -> Path:
    repo = into / "repo"
    for name in ("minilm", "minilm_tokenize", "minilm_encoder"):
        shutil.copytree(MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)), np.float64
    )


def one_server(server: Server, seconds: float, corpus_file: Path,
               reference: np.ndarray) -> dict[int, dict[str, float]]:  # fmt: skip
    server.start()
    try:
        got = post(CHECK)
        similarity = cosine(got, reference)
        if got.shape != reference.shape or similarity.min() <= 0.999:
            raise RuntimeError(f"{server.name}: wrong embedding (cosine {similarity})")
        wrk(64, 2, corpus_file)  # warm-up
        results: dict[int, dict[str, float]] = {}
        for connections in CONNECTIONS:
            before = server.padding()
            r = wrk(connections, seconds, corpus_file)
            after = server.padding()
            batches_, rows, real, padded = (a - b for a, b in zip(after, before, strict=True))
            r["waste"] = (padded - real) / real if real else float("nan")
            r["rows_per_batch"] = rows / batches_ if batches_ else float("nan")
            r["cosine"] = float(similarity.min())
            results[connections] = r
            print(f"  {server.name:9} c={connections:<3} {r['rps']:8.1f} sentences/s  "
                  f"p50 {r['p50']:8.1f} ms  p99 {r['p99']:8.1f} ms  waste {r['waste']:.3f}  "
                  f"rows/batch {r['rows_per_batch']:.1f}  errors {r['errors']:g}",
                  flush=True)  # fmt: skip
        return results
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seconds", nargs="?", type=float, default=6, help="per run")
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("--servers", default="inferd,mosec,litserve,mlserver")
    parser.add_argument("--count", type=int, default=2000, help="corpus sentences")
    parser.add_argument("--json", help="also write every run and the medians to this file")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("needs wrk on the PATH (apt-get install wrk)")
    names = args.servers.split(",")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.seconds:g} s per run, {args.rounds} rounds, {args.count} sentences",
          flush=True)  # fmt: skip
    encoder = Encoder()
    sentences = [s.decode() for s in corpus(args.count)]
    plans = {way: batches(encoder, sentences, way) for way in WAYS}
    reference = encoder.embed(CHECK)
    runs: dict[str, dict[int, list[dict[str, float]]]] = {n: {} for n in names}
    ceilings: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="minilm-peers-") as tmp:
        corpus_file = Path(tmp) / "corpus.txt"
        corpus_file.write_text("".join(s + "\n" for s in sentences))
        repo = build_repository(Path(tmp))
        for way in WAYS:
            one_pass(encoder, plans[way][:16])  # warm-up
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            print(f"round {round_ + 1}: {' '.join(order)}, ceilings", flush=True)
            for name in order:
                server = Server(name, repo, Path(tmp))
                for connections, r in one_server(server, args.seconds, corpus_file,
                                                 reference).items():  # fmt: skip
                    runs[name].setdefault(connections, []).append(r)
            for way in WAYS if round_ % 2 == 0 else tuple(reversed(WAYS)):
                c = one_pass(encoder, plans[way])
                ceilings[way].append(c)
                print(
                    f"  {way:18} ORT alone {c['ort_alone_per_s']:7.1f}/s  with tokenising "
                    f"{c['with_tokenising_per_s']:7.1f}/s  waste {c['padding_waste']:.3f}  "
                    f"p50 {c['p50_ms']:.2f} ms (run {c['run_p50_ms']:.2f})",
                    flush=True,
                )
    med = {
        name: {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in by.items()}
        for name, by in runs.items()
    }
    ceil = {
        way: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for way, rs in ceilings.items()
    }
    print("\nmedians over the rounds")
    print(f"{'server':9} {'conns':>5} {'sentences/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'waste':>6} {'rows/batch':>10}")  # fmt: skip
    for connections in CONNECTIONS:
        for name in names:
            m = med[name][connections]
            print(f"{name:9} {connections:5d} {m['rps']:11.1f} {m['p50']:8.1f} {m['p99']:8.1f} "
                  f"{m['waste']:6.3f} {m['rows_per_batch']:10.1f}")  # fmt: skip
    print(f"\n{'ceiling':18} {'ORT alone/s':>11} {'w/ tokenising/s':>15} {'waste':>6} "
          f"{'p50 ms':>7} {'run p50 ms':>10}")  # fmt: skip
    for way, c in ceil.items():
        print(f"{way:18} {c['ort_alone_per_s']:11.1f} {c['with_tokenising_per_s']:15.1f} "
              f"{c['padding_waste']:6.3f} {c['p50_ms']:7.2f} {c['run_p50_ms']:10.2f}")  # fmt: skip
    if "inferd" in med:
        i64, i1 = med["inferd"][64], med["inferd"][1]
        peers = [n for n in names if n != "inferd"]
        print()
        if peers:
            best = max(peers, key=lambda n: med[n][64]["rps"])
            b64 = med[best][64]
            print(f"64 connections: inferd / best peer ({best}) sentences/s = "
                  f"{i64['rps'] / b64['rps']:.2f}x (target >= 1.8); p99 {i64['p99']:.1f} vs "
                  f"{b64['p99']:.1f} ms (target: no worse)")  # fmt: skip
        s = ceil["batch 32 sorted"]
        print(
            f"64 connections: inferd / sorted batch-32 ceiling = "
            f"{i64['rps'] / s['ort_alone_per_s']:.1%} of ONNX Runtime alone, "
            f"{i64['rps'] / s['with_tokenising_per_s']:.1%} with tokenising (target >= 85%)"
        )
        g = ceil["64 clients grouped"]
        print(
            f"64 connections: inferd / its own grouping with nothing but the encoder = "
            f"{i64['rps'] / g['ort_alone_per_s']:.1%} of ONNX Runtime alone, "
            f"{i64['rps'] / g['with_tokenising_per_s']:.1%} with tokenising"
        )
        b1 = ceil["batch 1"]
        print(
            f"1 connection: inferd p50 {i1['p50']:.2f} ms vs batch 1 tokenise + run "
            f"{b1['p50_ms']:.2f} ms = {i1['p50'] / b1['p50_ms']:.2f}x (target <= 1.10)"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"runs": runs, "medians": med, "ceilings": ceil, "ceiling_runs": ceilings}, indent=1
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
