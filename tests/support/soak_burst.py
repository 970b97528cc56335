"""A burst of the soak: `clients` connections sending mlp requests back to back for
`seconds`, in a process of its own (so that its clients do not take the soak's own
interpreter from the steady clients and the probes). Every 200 is checked against
onnxruntime on the same model files; prints one JSON document:

    python -m tests.support.soak_burst --port P --clients 60 --seconds 20 --repo DIR

{"statuses": {"200": n, "429": n, "lost": n, ...}, "wrong": [...], "answers": [[sent,
answered, version], ...], "lost": [[sent, when, what], ...], "refusal_ms": [p50, p99]}:
times on the monotonic clock, which the soak's processes share (Linux CLOCK_MONOTONIC).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
import onnxruntime as ort

from tests.support.soak_repository import mlp_canary_onnx

RTOL, ATOL, POOL = 1e-4, 1e-5, 32


def _session(model: bytes | str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


async def burst(
    port: int, clients: int, seconds: float, repo: Path, seed: int
) -> dict[str, object]:
    pool = np.random.default_rng(seed).standard_normal((POOL, 64), dtype=np.float32)
    expected = {}
    for version, session in (("1", _session(str(repo / "mlp" / "1" / "model.onnx"))),
                             ("2", _session(mlp_canary_onnx()))):  # fmt: skip
        expected[version] = session.run(None, {"input": pool})[0]
    statuses: Counter[str] = Counter()
    wrong: list[str] = []
    answers: list[tuple[float, float, str]] = []
    refusals: list[float] = []
    lost: list[tuple[float, float, str]] = []
    url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
    stop_at = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        # Idle connections dropped before the server's keep-alive (5 s) can close them: a
        # busy client's reuse of one the server just closed would be lost, by no fault of
        # the server's.
        connector=aiohttp.TCPConnector(limit=clients, keepalive_timeout=2.0),
        timeout=timeout,
    ) as session:

        async def client(n: int) -> None:
            i = n
            while time.monotonic() < stop_at:
                row = i % POOL
                i += clients
                body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                    "data": pool[row].tolist()}]}  # fmt: skip
                sent = time.monotonic()
                try:
                    async with session.post(url, json=body) as r:
                        status = str(r.status)
                        doc = await r.json(content_type=None) if r.status == 200 else None
                except (aiohttp.ClientError, TimeoutError) as exc:
                    statuses["lost"] += 1
                    lost.append((sent, time.monotonic(), f"{type(exc).__name__}: {exc}"[:200]))
                    continue
                answered = time.monotonic()
                statuses[status] += 1
                if doc is None:
                    refusals.append(answered - sent)
                    continue
                version = str(doc.get("model_version", ""))
                answers.append((sent, answered, version))
                want = expected.get(version)
                got = np.array(
                    next(o["data"] for o in doc["outputs"] if o["name"] == "probabilities"),
                    np.float32,
                )
                if want is None or not np.allclose(got, want[row], rtol=RTOL, atol=ATOL):
                    ref = None if want is None else want[row][:4]
                    wrong.append(f"mlp v{version} row {row}: {got[:4]}... expected {ref}...")

        await asyncio.gather(*(client(n) for n in range(clients)))
    refusals.sort()
    pct = [refusals[int(q * (len(refusals) - 1))] * 1000 for q in (0.5, 0.99)] if refusals else []
    return {"statuses": dict(statuses), "wrong": wrong[:50], "wrong_count": len(wrong),
            "answers": answers, "lost": lost, "refusal_ms": pct}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    result = asyncio.run(burst(args.port, args.clients, args.seconds, args.repo, args.seed))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
