"""Serve "tiny", "mlp" or "minilm" with Mosec (Rust HTTP front end + Python worker processes).

    benchmarks/peers/run_peer.sh mosec tiny 8300               # v2 JSON route
    benchmarks/peers/run_peer.sh mosec tiny 8300 --api native  # Mosec's own /inference route
    .venv-mosec/bin/python mosec_server.py --model tiny --port 8300 [--api v2|native]

Dynamic batching: max_batch_size 32, max_wait_time 2 ms, one worker process (--workers N
for more; `mosec-wN` in the compare scripts).

Mosec has no KServe v2 protocol, but its routes and (de)serialization are ours to define:
--api v2 (default) registers POST /v2/models/MODEL/infer and parses/writes the v2 JSON body
(FP32 input, outputs as {"name","datatype","shape","data"}), so the same wrk script and
verify.py work unchanged. Only the infer route is v2: there are no /v2/health/* or metadata
routes (Mosec answers GET / for health). --api native serves POST /inference with a bare JSON
list of 64 floats (one row) and replies with a JSON list (tiny) or
{"probabilities": [...], "label": n} (mlp): use mosec_infer.lua for it.
The (de)serialization runs in the worker process, like Mosec's own JSON handling.

--model minilm (v2 only): text in, embedding out, as inferd's `minilm` ensemble: a v2 body
with the BYTES input `text` (one sentence per request, shape [1, 1]) and the FP32 output
`embedding` [1, 384]. Mosec hands forward() the batch in arrival order; it is tokenised,
padded to its longest and encoded at once (common_models.MiniLM, which logs its padding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from mosec import Runtime, Server, Worker
from mosec.errors import ValidationError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common_models  # noqa: E402


class _Base(Worker):
    model_name = ""
    resp_mime_type = "application/json"

    def __init__(self) -> None:
        super().__init__()
        self.model = common_models.load(self.model_name)

    def forward(self, data: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
        # data: one [rows, 64] array per request in this dynamic batch
        sizes = [len(x) for x in data]
        outputs = self.model(np.concatenate(data) if len(data) > 1 else data[0])
        bounds = np.cumsum(sizes)[:-1]
        split = {name: np.split(value, bounds) for name, value in outputs.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(data))]


class _V2(_Base):
    def deserialize(self, data: bytes) -> np.ndarray:
        try:
            tensor = json.loads(data)["inputs"][0]
            x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ValidationError(f"bad v2 request: {exc}") from exc
        if x.ndim != 2 or x.shape[1] != 64:
            raise ValidationError(f"expected shape [rows, 64], got {list(x.shape)}")
        return x

    def serialize(self, data: dict[str, np.ndarray]) -> bytes:
        return json.dumps(common_models.v2_response(self.model_name, data)).encode()


class _Native(_Base):
    def deserialize(self, data: bytes) -> np.ndarray:
        try:
            x = np.asarray(json.loads(data), dtype=np.float32)
        except (ValueError, TypeError) as exc:
            raise ValidationError(f"bad request: {exc}") from exc
        if x.shape != (64,):
            raise ValidationError(f"expected a JSON list of 64 numbers, got shape {list(x.shape)}")
        return x[None, :]

    def serialize(self, data: dict[str, np.ndarray]) -> bytes:
        if self.model_name == "tiny":
            return json.dumps(data["OUTPUT"][0].tolist()).encode()
        return json.dumps(
            {"probabilities": data["probabilities"][0].tolist(), "label": int(data["label"][0, 0])}
        ).encode()


class MiniLMV2(Worker):
    resp_mime_type = "application/json"

    def __init__(self) -> None:
        super().__init__()
        self.model = common_models.MiniLM()

    def deserialize(self, data: bytes) -> list[str]:
        try:
            return common_models.minilm_request_text(json.loads(data))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ValidationError(f"bad v2 request: {exc}") from exc

    def forward(self, data: list[list[str]]) -> list[np.ndarray]:
        # data: one request's sentences per entry of this dynamic batch, in arrival order
        embeddings = self.model([text for texts in data for text in texts])
        bounds = np.cumsum([len(texts) for texts in data])[:-1]
        return np.split(embeddings, bounds)

    def serialize(self, data: np.ndarray) -> bytes:
        return json.dumps(common_models.v2_response("minilm", {"embedding": data})).encode()


# Module-level classes: Mosec spawns worker processes and finds the worker class by name.
class TinyV2(_V2):
    model_name = "tiny"


class MlpV2(_V2):
    model_name = "mlp"


class TinyNative(_Native):
    model_name = "tiny"


class MlpNative(_Native):
    model_name = "mlp"


WORKERS = {
    ("tiny", "v2"): TinyV2,
    ("mlp", "v2"): MlpV2,
    ("tiny", "native"): TinyNative,
    ("mlp", "native"): MlpNative,
    ("minilm", "v2"): MiniLMV2,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=[*sorted(common_models.SIGNATURES), "minilm"], required=True)
    p.add_argument("--port", type=int, default=8000, help="HTTP port (read by Mosec itself)")
    p.add_argument("--api", choices=["v2", "native"], default="v2")
    p.add_argument("--workers", type=int, default=1, help="Python worker processes")
    # Mosec parses sys.argv itself (parse_known_args): --port and its other flags reach it.
    args, _ = p.parse_known_args()
    if (args.model, args.api) not in WORKERS:
        p.error(f"--model {args.model} has no --api {args.api}")
    route = f"/v2/models/{args.model}/infer" if args.api == "v2" else "/inference"
    runtime = Runtime(
        WORKERS[(args.model, args.api)],
        num=args.workers,
        max_batch_size=common_models.MAX_BATCH,
        max_wait_time=int(common_models.MAX_DELAY_S * 1000),  # milliseconds
    )
    server = Server()
    server.register_runtime({route: [runtime]})
    server.run()


if __name__ == "__main__":
    main()
