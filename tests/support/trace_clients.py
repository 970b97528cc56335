"""tritonclient's trace settings calls (`get_trace_settings`, `update_trace_settings`) and a
small infer, over HTTP or gRPC behind one interface answering plain dicts, for the trace
settings' case tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.servers import RunningServer


class TraceClient:
    """tritonclient's trace calls, over either protocol, answering plain dicts."""

    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        address = f"127.0.0.1:{server.port}" if protocol == "http" else server.grpc_address
        self.raw = self.mod.InferenceServerClient(address)

    def _plain(self, answer: Any) -> dict[str, Any]:
        if self.protocol == "http":
            return dict(answer)
        values = {k: v.get("value", []) for k, v in answer["settings"].items()}
        return {k: v if k == "trace_level" else (v[0] if v else "") for k, v in values.items()}

    def get(self, model: str | None = None) -> dict[str, Any]:
        if self.protocol == "http":
            return self._plain(self.raw.get_trace_settings(model_name=model))
        return self._plain(self.raw.get_trace_settings(model_name=model, as_json=True))

    def update(self, settings: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        if self.protocol == "http":
            return self._plain(self.raw.update_trace_settings(model_name=model, settings=settings))
        answer = self.raw.update_trace_settings(model_name=model, settings=settings, as_json=True)
        return self._plain(answer)

    def infer(self, model: str, n: int, request_id: str = "") -> None:
        """`n` requests of one row to a model of `write_counter` (input IN, [1, 2] FP32)."""
        for _ in range(n):
            inp = self.mod.InferInput("IN", [1, 2], "FP32")
            inp.set_data_from_numpy(np.ones((1, 2), np.float32))
            self.raw.infer(model, [inp], request_id=request_id)

    def close(self) -> None:
        self.raw.close()
