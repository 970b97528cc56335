"""One client interface over HTTP and gRPC (tritonclient), so that a case table runs over both
protocols (PROTOCOLS)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.servers import RunningServer

PROTOCOLS = ["http", "grpc"]


class Client:
    """tritonclient.http or tritonclient.grpc behind one small interface."""

    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        address = f"127.0.0.1:{server.port}" if protocol == "http" else server.grpc_address
        self.raw = self.mod.InferenceServerClient(address)

    def inputs(self, tensors: dict[str, tuple[np.ndarray, str]]) -> list[Any]:
        made = []
        for name, (array, datatype) in tensors.items():
            inp = self.mod.InferInput(name, list(array.shape), datatype)
            inp.set_data_from_numpy(array)
            made.append(inp)
        return made

    def infer(self, model: str, tensors: dict[str, tuple[np.ndarray, str]], **kwargs: Any) -> Any:
        outputs = kwargs.pop("outputs", None)
        if outputs is not None:
            kwargs["outputs"] = [self.mod.InferRequestedOutput(n) for n in outputs]
        return self.raw.infer(model, self.inputs(tensors), **kwargs)
