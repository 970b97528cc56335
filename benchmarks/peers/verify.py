"""Check that a peer serves a model correctly: one request with a known input.

    .venv/bin/python benchmarks/peers/verify.py --model tiny --url http://127.0.0.1:8100
    (v2 JSON: Triton, MLServer, Mosec --api v2 and LitServe all serve /v2/models/MODEL/infer)
    ... --api grpc --url 127.0.0.1:8101   # v2 gRPC (Triton, MLServer)
    ... --api native                      # Mosec's own route (/inference) instead of v2 JSON

Run with inferd's venv (numpy + onnxruntime): the expected MLP output comes from a local
onnxruntime session on the same ONNX file. Sends one row (shape [1, 64]) and a 3-row batch.
Exit status 0 when every output matches.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common_models  # noqa: E402

V2_TYPES = {"FP32": np.float32, "INT64": np.int64}


def post(url: str, body: dict | list) -> dict | list:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def infer_v2(base: str, model: str, x: np.ndarray) -> dict[str, np.ndarray]:
    in_name = common_models.SIGNATURES[model][0][0][0]
    body = {
        "inputs": [
            {
                "name": in_name,
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }
    out = post(f"{base}/v2/models/{model}/infer", body)
    return {
        o["name"]: np.asarray(o["data"], V2_TYPES[o["datatype"]]).reshape(o["shape"])
        for o in out["outputs"]
    }


def infer_grpc(target: str, model: str, x: np.ndarray) -> dict[str, np.ndarray]:
    # KServe v2 gRPC (Triton: --port+1, MLServer: MLSERVER_GRPC_PORT = PORT+1), via tritonclient.
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target)
    ins, outs = common_models.SIGNATURES[model]
    inp = grpcclient.InferInput(ins[0][0], list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer(
        model, [inp], outputs=[grpcclient.InferRequestedOutput(n) for n, _, _ in outs]
    )
    return {n: res.as_numpy(n) for n, _, _ in outs}


def infer_native(base: str, model: str, x: np.ndarray) -> dict[str, np.ndarray]:
    # Mosec's own route takes one row per request: a JSON list of 64 floats.
    rows = [post(f"{base}/inference", row.tolist()) for row in x]
    if model == "tiny":
        return {"OUTPUT": np.asarray(rows, np.float32)}
    return {
        "probabilities": np.asarray([r["probabilities"] for r in rows], np.float32),
        "label": np.asarray([[r["label"]] for r in rows], np.int64),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(common_models.SIGNATURES), required=True)
    p.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8100 (grpc: 127.0.0.1:8101)")
    p.add_argument("--api", choices=["v2", "grpc", "native"], default="v2")
    args = p.parse_args()

    model = common_models.load(args.model)
    infer = {"v2": infer_v2, "grpc": infer_grpc, "native": infer_native}[args.api]
    rng = np.random.default_rng(1234)
    ok = True
    for rows in (1, 3):
        x = rng.normal(size=(rows, 64)).astype(np.float32)
        want = model(x)
        got = infer(args.url.rstrip("/"), args.model, x)
        for name, w in want.items():
            g = got.get(name)
            good = (
                g is not None
                and g.shape == w.shape
                and (
                    np.array_equal(g, w)
                    if w.dtype.kind == "i"
                    else np.allclose(g, w, rtol=1e-5, atol=1e-6)
                )
            )
            err = (
                ""
                if g is None or g.shape != w.shape
                else f" max|diff|={np.max(np.abs(g.astype(np.float64) - w)):.2e}"
            )
            shape = None if g is None else list(g.shape)
            print(f"{'OK ' if good else 'BAD'} {args.model} rows={rows} {name} shape={shape}{err}")
            ok &= bool(good)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
