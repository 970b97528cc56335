"""What one connection costs on this machine: the minilm service's p50 at one connection in
inferd and in three bare HTTP servers, against ONNX Runtime alone at batch 1 plus
tokenisation in process (issue 32's target: inferd within 10% of the latter).

The bare servers are the least a server can do for the same request (uvloop, httptools,
orjson, `tokenizers` and the example's ONNX encoder as `benchmarks/minilm_ceiling.py` runs
it; no checks, no batching, no metrics):

- `inline`: tokenises and runs the encoder on the event loop itself, so it can serve one
  connection only: what the HTTP round trip alone costs;
- `thread`: tokenises on the loop and runs the encoder in a worker thread (one hand-over
  there and one back), as a server must that keeps its loop free while a model runs;
- `two threads`: tokenises in one thread and runs the encoder in another, as inferd's
  `minilm` ensemble does (its tokenizer step, then its encoder step).

Each round runs every server in turn (order rotating; wrk, one connection, the corpus in
its order, benchmarks/wrk/minilm_corpus.lua) and the in-process batch-1 pass over the same
corpus; medians over the rounds.

    .venv/bin/python benchmarks/minilm_floor.py [SECONDS per run] [ROUNDS]
    .venv/bin/python benchmarks/minilm_floor.py --hops   # what one hand-over costs here

Needs wrk and `make models` (the minilm example).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from benchmarks.minilm_ceiling import Encoder, batches, one_pass  # noqa: E402
from benchmarks.minilm_corpus import corpus  # noqa: E402
from benchmarks.minilm_peers import (  # noqa: E402
    CHECK,
    PORT,
    Server,
    build_repository,
    cosine,
    post,
    wrk,
)
from tests.support.server_process import check_port_free, wait_until_serving  # noqa: E402

MODES = ("inline", "thread", "two threads")


def serve(mode: str, port: int) -> None:
    """A bare v2 endpoint for `minilm`: BYTES `text` rows in, their `embedding` out."""
    import httptools
    import orjson
    import uvloop

    encoder = Encoder()
    tokenising = ThreadPoolExecutor(1) if mode == "two threads" else None
    running = ThreadPoolExecutor(1) if mode != "inline" else None
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "

    def answer(embedding: np.ndarray) -> bytes:
        body = orjson.dumps(
            {"model_name": "minilm", "model_version": "1", "outputs": [{
                "name": "embedding", "datatype": "FP32", "shape": list(embedding.shape),
                "data": embedding.ravel()}]},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )  # fmt: skip
        return head + str(len(body)).encode() + b"\r\n\r\n" + body

    def text_of(body: bytes) -> list[str]:
        return [str(text) for text in orjson.loads(body)["inputs"][0]["data"]]

    class Http(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.body = []

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body = b"".join(self.body)
            if self.parser.get_method() != b"POST":  # a readiness check
                self.transport.write(head + b"2\r\n\r\n{}")
            elif mode == "inline":
                ids, mask, _ = encoder.tokenise(text_of(body))
                self.transport.write(answer(encoder.run(ids, mask)))
            else:
                asyncio.get_running_loop().create_task(self.answer(body))

        async def answer(self, body: bytes) -> None:
            loop = asyncio.get_running_loop()
            if tokenising is not None:
                ids, mask, _ = await loop.run_in_executor(
                    tokenising, encoder.tokenise, text_of(body)
                )
            else:
                ids, mask, _ = encoder.tokenise(text_of(body))
            embedding = await loop.run_in_executor(running, encoder.run, ids, mask)
            if not self.transport.is_closing():  # wrk closes its connection mid-request
                self.transport.write(answer(embedding))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Http, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def hops(calls: int = 300) -> None:
    """What a hand-over to a worker thread and back costs here (uvloop, `run_in_executor`,
    one thread): p50 of the loop -> thread and thread -> loop legs, around an empty call and
    around one encoder run, which leaves the loop's thread idle meanwhile."""
    import time

    import uvloop

    encoder = Encoder()
    ids, mask, _ = encoder.tokenise([CHECK[0]])
    worker = ThreadPoolExecutor(1)

    def call(run: bool) -> tuple[int, int]:
        started = time.perf_counter_ns()
        if run:
            encoder.run(ids, mask)
        return started, time.perf_counter_ns()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for round_ in range(2):
            for what, run in (("empty call", False), ("encoder run", True)):
                there, back = [], []
                for _ in range(calls):
                    sent = time.perf_counter_ns()
                    started, ended = await loop.run_in_executor(worker, call, run)
                    there.append(started - sent)
                    back.append(time.perf_counter_ns() - ended)
                print(f"round {round_ + 1}, {what:11}: loop -> thread p50 "
                      f"{statistics.median(there) / 1e3:6.1f} us, thread -> loop p50 "
                      f"{statistics.median(back) / 1e3:6.1f} us", flush=True)  # fmt: skip

    uvloop.run(main())


class Bare:
    """A bare server (`serve`) on PORT, in its own process."""

    def __init__(self, mode: str) -> None:
        self.name = mode
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        check_port_free(PORT)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", self.name, "--port", str(PORT)],
            start_new_session=True,
        )
        wait_until_serving(self.process.pid, PORT, "/", exit_code=self.process.poll,
                           timeout_s=60)  # fmt: skip

    def stop(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seconds", nargs="?", type=float, default=6, help="per run")
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("--hops", action="store_true", help="only time a thread hand-over")
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=PORT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    if args.hops:
        hops()
        return
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = platform.processor() or platform.machine()
    print(f"{now}, {machine}, {os.cpu_count()} CPUs, {args.seconds:g} s per run, "
          f"{args.rounds} rounds, one connection", flush=True)  # fmt: skip
    encoder = Encoder()
    sentences = [s.decode() for s in corpus()]
    plan = batches(encoder, sentences, "batch 1")
    reference = encoder.embed(CHECK)
    names = ["inferd", *MODES]
    p50: dict[str, list[float]] = {name: [] for name in [*names, "in process"]}
    with tempfile.TemporaryDirectory(prefix="minilm-floor-") as tmp:
        corpus_file = Path(tmp) / "corpus.txt"
        corpus_file.write_text("".join(s + "\n" for s in sentences))
        repo = build_repository(Path(tmp))
        one_pass(encoder, plan[:16])  # warm-up
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            print(f"round {round_ + 1}: {', '.join(order)}, in process", flush=True)
            for name in order:
                server: Server | Bare = (
                    Server(name, repo, Path(tmp)) if name == "inferd" else Bare(name)
                )
                server.start()
                try:
                    similarity = cosine(post(CHECK), reference)
                    if similarity.min() <= 0.999:
                        raise RuntimeError(f"{name}: wrong embedding (cosine {similarity})")
                    wrk(1, 2, corpus_file)  # warm-up
                    r = wrk(1, args.seconds, corpus_file)
                finally:
                    server.stop()
                p50[name].append(r["p50"])
                print(f"  {name:12} p50 {r['p50']:6.2f} ms  {r['rps']:7.1f} sentences/s",
                      flush=True)  # fmt: skip
            c = one_pass(encoder, plan)
            p50["in process"].append(c["p50_ms"])
            print(f"  {'in process':12} p50 {c['p50_ms']:6.2f} ms (run {c['run_p50_ms']:.2f})",
                  flush=True)  # fmt: skip
    base = statistics.median(p50["in process"])
    print("\nmedians over the rounds, one connection")
    print(f"{'server':12} {'p50 ms':>7} {'over in process':>15} {'ratio':>6}")
    for name, values in p50.items():
        m = statistics.median(values)
        print(f"{name:12} {m:7.2f} {m - base:+12.2f} ms {m / base:6.2f}x")


if __name__ == "__main__":
    main()
