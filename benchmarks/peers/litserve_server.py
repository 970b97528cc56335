"""Serve "tiny", "mlp" or "minilm" with LitServe (FastAPI/uvicorn front end + a worker process).

    benchmarks/peers/run_peer.sh litserve tiny 8400
    .venv-litserve/bin/python litserve_server.py --model tiny --port 8400 [--no-fast-queue]
    ... [--api-servers N] [--log-level LEVEL]

Dynamic batching: LitAPI(max_batch_size=32, batch_timeout=0.002), one inference worker
(accelerator "cpu", workers_per_device=1) and one API server process (num_api_servers=1).

LitServe has no KServe v2 protocol, but a LitAPI sets its own route (LitAPI(api_path=...)) and
its own (de)serialization: this serves POST /v2/models/MODEL/infer and reads/writes the v2
JSON body, so the same wrk script and verify.py work unchanged. Only the infer route is v2:
LitServe answers GET /health (200 once the worker is ready) and GET /info, and has no gRPC.
The API server parses the JSON; decode_request/encode_response run in the inference worker.

fast_queue=True (the default here; --no-fast-queue turns it off) sends the responses back
over ZeroMQ instead of a multiprocessing Manager queue, as LitServe advises above ~100 req/s.
Requests always go to the worker through a Manager queue.

--model minilm: text in, embedding out, as inferd's `minilm` ensemble: a v2 body with the
BYTES input `text` (one sentence per request, shape [1, 1]) and the FP32 output `embedding`
[1, 384]. predict() gets the batch in arrival order; it is tokenised, padded to its longest
and encoded at once (common_models.MiniLM, which logs its padding).

Set LITSERVE_BATCH_LOG=1 to have the worker log, once a second while batches come, how many
batches it ran of each size (requests per batch) and the rows in them; off, it costs nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import threading
import time

import litserve as ls
import numpy as np
from fastapi.responses import JSONResponse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common_models  # noqa: E402


class _BadRequest(str):
    """decode_request's result for an invalid request: answered 400 alone, not with its batch."""


# Module level: LitServe pickles the LitAPI into a spawned worker process.
class V2Api(ls.LitAPI):
    def __init__(self, model_name: str, **kwargs) -> None:
        super().__init__(api_path=f"/v2/models/{model_name}/infer", **kwargs)
        self.model_name = model_name

    def setup(self, device: str) -> None:
        # In the worker: leave the group's SIGINT (stop_peer.sh) to the main process, which
        # then terminates this worker (else a KeyboardInterrupt traceback lands in the log).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.model = common_models.load(self.model_name)
        self.stats = None
        if os.environ.get("LITSERVE_BATCH_LOG") == "1":
            self.stats = _BatchStats()

    # Runs in the worker, once per request; the API server has parsed the JSON body already.
    # No annotation on `request`: LitServe would make it FastAPI's (validated) body type.
    def decode_request(self, request):
        try:
            tensor = request["inputs"][0]
            x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return _BadRequest(f"bad v2 request: {exc!r}")
        if x.ndim != 2 or x.shape[1] != 64:
            return _BadRequest(f"expected shape [rows, 64], got {list(x.shape)}")
        return x

    def batch(self, inputs: list) -> list:
        # LitServe's default np.stack()s the requests; they can carry several rows each, so
        # predict() concatenates them instead and splits the outputs back.
        return inputs

    def predict(self, inputs: list) -> list:
        good = [x for x in inputs if not isinstance(x, _BadRequest)]
        if self.stats is not None:
            self.stats.add(len(inputs), sum(len(x) for x in good))
        if not good:
            return inputs
        outputs = self.model(np.concatenate(good) if len(good) > 1 else good[0])
        bounds = np.cumsum([len(x) for x in good])[:-1]
        split = {name: np.split(value, bounds) for name, value in outputs.items()}
        results, i = [], 0
        for x in inputs:
            if isinstance(x, _BadRequest):
                results.append(x)
            else:
                results.append({name: parts[i] for name, parts in split.items()})
                i += 1
        return results

    def encode_response(self, output):
        if isinstance(output, _BadRequest):
            return JSONResponse({"error": str(output)}, status_code=400)
        return common_models.v2_response(self.model_name, output)


class MiniLMApi(V2Api):
    def setup(self, device: str) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as V2Api.setup
        self.model = common_models.MiniLM()
        self.stats = _BatchStats() if os.environ.get("LITSERVE_BATCH_LOG") == "1" else None

    def decode_request(self, request):
        try:
            return common_models.minilm_request_text(request)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return _BadRequest(f"bad v2 request: {exc!r}")

    def predict(self, inputs: list) -> list:
        good = [texts for texts in inputs if not isinstance(texts, _BadRequest)]
        if self.stats is not None:
            self.stats.add(len(inputs), sum(len(texts) for texts in good))
        if not good:
            return inputs
        embeddings = self.model([text for texts in good for text in texts])
        parts = iter(np.split(embeddings, np.cumsum([len(texts) for texts in good])[:-1]))
        return [x if isinstance(x, _BadRequest) else {"embedding": next(parts)} for x in inputs]


class _BatchStats:
    """Counts batches by size; a daemon thread logs the totals once a second when they change."""

    def __init__(self) -> None:
        self.sizes: collections.Counter[int] = collections.Counter()
        self.rows = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._report, daemon=True, name="batch-log").start()

    def add(self, requests: int, rows: int) -> None:
        with self.lock:
            self.sizes[requests] += 1
            self.rows += rows

    def _report(self) -> None:
        last = None
        while True:
            time.sleep(1)
            with self.lock:
                sizes = sorted(self.sizes.items())
                batches, rows = sum(n for _, n in sizes), self.rows
            if batches and batches != last:
                last = batches
                hist = " ".join(f"{s}:{n}" for s, n in sizes)
                print(
                    f"batches {batches}, rows {rows} ({rows / batches:.1f}/batch), "
                    f"max {sizes[-1][0]} requests; requests per batch: count {hist}",
                    file=sys.stderr,
                    flush=True,
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=[*sorted(common_models.SIGNATURES), "minilm"], required=True)
    p.add_argument("--port", type=int, default=8000, help="HTTP port")
    p.add_argument(
        "--no-fast-queue",
        dest="fast_queue",
        action="store_false",
        help="responses over a multiprocessing Manager queue instead of ZeroMQ",
    )
    p.add_argument(
        "--api-servers",
        type=int,
        default=1,
        help="uvicorn (HTTP) processes feeding the worker (LitServe's default: one per worker)",
    )
    p.add_argument("--log-level", default="info")
    args = p.parse_args()
    # A background job of a non-interactive shell (run_peer.sh's `setsid ... &`) starts with
    # SIGINT ignored, and Python then leaves it ignored: LitServe's main process would never
    # see stop_peer.sh's SIGINT (uvicorn, which sets its own handlers, would stop alone).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    api = (MiniLMApi if args.model == "minilm" else V2Api)(
        args.model,
        max_batch_size=common_models.MAX_BATCH,
        batch_timeout=common_models.MAX_DELAY_S,
    )
    server = ls.LitServer(
        api,
        accelerator="cpu",
        workers_per_device=1,
        fast_queue=args.fast_queue,
        # LitServe's defaults, spelled out: no limit on requests in flight (nothing like Ray
        # Serve's max_ongoing_requests), no payload limit (max_payload_size=None), no
        # request counting middleware; a request waiting over 30 s in the queue gets a 504.
        timeout=30,
        track_requests=False,
        max_payload_size=None,
    )
    server.run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=args.api_servers,
        log_level=args.log_level,
        generate_client_file=False,  # it would write client.py into the current directory
        access_log=False,  # uvicorn's per-request log line (the other peers log none)
    )


if __name__ == "__main__":
    main()
