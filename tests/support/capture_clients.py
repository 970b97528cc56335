"""One request to a signed model (tests/support/monitoring_models.py) over each wire the capture
and feedback tests compare: v2 JSON (httpx), binary tensors (tritonclient.http), gRPC
(tritonclient.grpc). Each answers the same `Answer`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.servers import RunningServer

WIRES = ["json", "binary", "grpc"]
PROTOCOL = {"json": "http", "binary": "http", "grpc": "grpc"}


@dataclass
class Answer:
    id: str  # the response's id: the client's, or the server's for a captured request
    version: str
    y: np.ndarray
    cls: np.ndarray


class Client:
    def __init__(self, wire: str, server: RunningServer) -> None:
        self.wire = wire
        self.json: httpx.Client | None = None
        self.triton: Any = None
        if wire == "json":
            self.json = server.client()
        elif wire == "binary":
            self.triton = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        else:
            self.triton = grpcclient.InferenceServerClient(server.grpc_address)

    def close(self) -> None:
        if self.json is not None:
            self.json.close()
        if self.triton is not None:
            self.triton.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def infer(self, model: str, x: np.ndarray, request_id: str = "") -> Answer:
        if self.json is not None:
            doc: dict[str, Any] = {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": list(x.shape),
                        "data": x.ravel().tolist(),
                    }
                ]
            }
            if request_id:
                doc["id"] = request_id
            r = self.json.post(f"/v2/models/{model}/infer", json=doc)
            assert r.status_code == 200, r.text
            answer = r.json()
            out = {o["name"]: o for o in answer["outputs"]}
            return Answer(
                answer.get("id", ""),
                answer["model_version"],
                np.array(out["y"]["data"], np.float32).reshape(out["y"]["shape"]),
                np.array(out["cls"]["data"], np.int64).reshape(out["cls"]["shape"]),
            )
        module = httpclient if self.wire == "binary" else grpcclient
        inp = module.InferInput("x", list(x.shape), "FP32")
        if self.wire == "binary":
            inp.set_data_from_numpy(x, binary_data=True)
            outputs = [module.InferRequestedOutput(n, binary_data=True) for n in ("y", "cls")]
        else:
            inp.set_data_from_numpy(x)
            outputs = [module.InferRequestedOutput(n) for n in ("y", "cls")]
        result = self.triton.infer(model, [inp], outputs=outputs, request_id=request_id)
        response = result.get_response()
        if self.wire == "binary":
            rid, version = response.get("id", ""), response["model_version"]
        else:
            rid, version = response.id, response.model_version
        return Answer(rid, version, result.as_numpy("y"), result.as_numpy("cls"))
