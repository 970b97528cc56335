"""Clients of decoupled models' streams for the tests: tritonclient's gRPC stream, and
HTTP generate_stream's server-sent events parsed by hand; and the server state they wait on."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from tests.support.async_infer import Addresses
from tests.support.servers import STATE_DEADLINE_S, RunningServer


@dataclass
class Stream:
    """What one request's stream brought: each response's (OUT, IDX), errors in place as
    ("error", message), and whether the last item carried the final flag."""

    items: list[tuple[Any, Any]] = field(default_factory=list)
    final_flags: list[bool] = field(default_factory=list)

    @property
    def outs(self) -> list[int]:
        return [out for out, _ in self.items if out != "error"]


def grpc_inputs(values: dict[str, int]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value in values.items():
        inp = grpcclient.InferInput(name, [1], "INT32")
        inp.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(inp)
    return inputs


class GrpcStream:
    """One gRPC ModelStreamInfer call with tritonclient; answers collected per request id."""

    def __init__(self, server: Addresses) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_address)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, request_id: str, empty_final: bool = True, **values: int) -> None:
        self.client.async_stream_infer(
            model,
            grpc_inputs(values),
            request_id=request_id,
            enable_empty_final_response=empty_final,
        )

    def next(self) -> tuple[Any, Any]:
        return self.answers.get(timeout=STATE_DEADLINE_S)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def grpc_collect(
    stream: GrpcStream, expected_finals: int, final_errors: bool = False
) -> dict[str, Stream]:
    """Read until `expected_finals` requests have had their final response. tritonclient
    hands an error over without its response (no id, no final flag): errors are only used
    with one request in flight, and `final_errors` says that an error ends it."""
    streams: dict[str, Stream] = {}
    finals = 0
    last = ""
    while finals < expected_finals:
        result, error = stream.next()
        if error is not None:
            streams.setdefault(last, Stream()).items.append(("error", str(error)))
            finals += final_errors
            continue
        response = result.get_response()
        last = response.id
        s = streams.setdefault(response.id, Stream())
        final = response.parameters["triton_final_response"].bool_param
        s.final_flags.append(final)
        if response.outputs:
            s.items.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        finals += final
    return streams


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Server-sent events as the spec frames them: `data:` lines, a blank line ends one."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []
    if data:
        yield json.loads("\n".join(data))


def http_stream(server: RunningServer, model: str, **values: int) -> Stream:
    with (
        server.client() as client,
        client.stream("POST", f"/v2/models/{model}/generate_stream", json=values) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        s = Stream()
        for event in sse_events(r.iter_lines()):
            if "error" in event:
                s.items.append(("error", event["error"]))
            else:
                assert event["model_name"] == model and event["model_version"] == "1"
                s.items.append((event["OUT"], event["IDX"]))
        return s


def one_stream(
    protocol: str, server: RunningServer, model: str, final_errors: bool = False, **values: int
) -> Stream:
    if protocol == "http":
        return http_stream(server, model, **values)
    stream = GrpcStream(server)
    try:
        stream.send(model, "r", **values)  # type: ignore[arg-type]
        return grpc_collect(stream, 1, final_errors).get("r", Stream())
    finally:
        stream.close()


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + STATE_DEADLINE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.005)


def stats(server: RunningServer, model: str) -> dict[str, Any]:
    with server.client() as client:
        doc: dict[str, Any] = client.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return doc


def metric(server: RunningServer, name: str, model: str) -> float:
    text = httpx.get(server.metrics_url).text
    prefix = f'{name}{{model="{model}",version="1"'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def wait_for_count(server: RunningServer, model: str, key: str, count: int) -> dict[str, Any]:
    """The model's statistics once inference_stats[key] reached `count`."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while True:
        doc = stats(server, model)
        if doc["inference_stats"][key]["count"] >= count:
            return doc
        assert time.monotonic() < deadline, f"{key} did not reach {count}: {doc}"
        time.sleep(0.005)
