"""The soak's valid requests on the wire: one `Case` (tests/support/soak_references.py) sent
in one of the ways a client sends it, and what came back, as an `Answer`.

Ways (`MODES`): HTTP with JSON tensors, HTTP with binary tensors (Triton's extension),
HTTP `generate` and `generate_stream` (server-sent events), gRPC `ModelInfer`, and gRPC
`ModelStreamInfer` (a stream of one request: one response from a model that is not
decoupled, one per word from `word_stream`). Every call has a deadline of its own
(`CALL_TIMEOUT_S`); an answer that never comes is an answer too (`no_answer`).

HTTP goes through the standard library (`http.client`, one kept-alive connection per
client) and Triton's binary format is written and read here: the soak runs on what `make
serve` installs, which has neither httpx nor tritonclient's HTTP client.
"""

from __future__ import annotations

import http.client
import json
import queue
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.soak_references import Case

CALL_TIMEOUT_S = 30.0
IDLE_S = 2.0  # a connection idle longer is not reused (the server closes idle ones at 5 s)

# What a model is asked through (the steady traffic's table): every model over HTTP and
# gRPC, streams where the model streams or where a stream can carry it.
MODES: dict[str, tuple[str, ...]] = {
    "mlp": ("http_json", "http_binary", "grpc", "grpc_stream"),
    "mlp_torch": ("http_binary", "grpc"),
    "linear_noconfig": ("http_json", "grpc"),
    "text_stats": ("http_binary", "http_generate", "grpc", "grpc_stream"),
    "text_stats_raw": ("http_json", "grpc"),
    "add_sub": ("http_json", "grpc", "grpc_stream"),
    "recall_rank": ("http_binary", "grpc"),
    "word_stream": ("http_stream", "grpc_stream"),
}
NUMPY = {"FP32": "<f4", "FP64": "<f8", "INT32": "<i4", "INT64": "<i8"}


@dataclass(frozen=True)
class Answer:
    """`status`: `200`/`OK` with `outputs`, an HTTP status or gRPC code name, `lost` (the
    connection failed or closed without an answer) or `no_answer` (the deadline passed)."""

    status: str
    version: str = ""
    outputs: dict[str, np.ndarray] | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outputs is not None


def grpc_status(exc: InferenceServerException) -> str:
    """The gRPC code's name; `stream_error` for an error a stream carried in its response
    (ModelStreamInfer's error_message: a message without a code)."""
    status = exc.status()
    return "stream_error" if status is None else str(status).removeprefix("StatusCode.")


def _grpc_error(exc: InferenceServerException) -> Answer:
    return Answer(grpc_status(exc), detail=(exc.message() or "")[:300])


# -- Triton's HTTP tensors ---------------------------------------------------------------------


def _bytes_elements(array: np.ndarray) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in (bytes(x) for x in array.reshape(-1)))


def infer_body(case: Case, binary: bool) -> tuple[bytes, dict[str, str]]:
    """The request body and its headers: JSON tensors, or Triton's binary extension (a JSON
    header, then each tensor's bytes; BYTES elements length-prefixed)."""
    inputs, blobs = [], []
    for name, (array, datatype) in case.inputs.items():
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            blob = (
                _bytes_elements(array) if datatype == "BYTES"
                else np.ascontiguousarray(array, NUMPY[datatype]).tobytes()
            )  # fmt: skip
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == "BYTES":
            tensor["data"] = [bytes(x).decode() for x in array.reshape(-1)]
        else:
            tensor["data"] = array.reshape(-1).tolist()
        inputs.append(tensor)
    outputs = [{"name": n, "parameters": {"binary_data": binary}} for n in case.outputs]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    if not binary:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }


def _elements(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        out.append(data[at + 4 : at + 4 + n])
        at += 4 + n
    return out


def infer_outputs(body: bytes, header_length: str | None) -> tuple[str, dict[str, np.ndarray]]:
    """(model_version, outputs) of a response, JSON or binary."""
    size = int(header_length) if header_length else len(body)
    doc = json.loads(body[:size])
    at, outs = size, {}
    for o in doc["outputs"]:
        shape, datatype = o["shape"], o["datatype"]
        n = (o.get("parameters") or {}).get("binary_data_size")
        if n is not None:
            raw = body[at : at + n]
            at += n
            values = (
                np.array(_elements(raw), dtype=object) if datatype == "BYTES"
                else np.frombuffer(raw, NUMPY[datatype])
            )  # fmt: skip
        else:
            values = np.array(o["data"], dtype=object if datatype == "BYTES" else NUMPY[datatype])
        outs[o["name"]] = values.reshape(shape)
    return str(doc["model_version"]), outs


class Caller:
    """One client's connections: an HTTP connection and a gRPC channel, made again after a
    failed connection (a killed worker's) and every `RENEW_AFTER` calls, so that a client's
    requests move between `--workers` processes as real clients' do."""

    RENEW_AFTER = 200

    def __init__(self, http_port: int, grpc_port: int) -> None:
        self.http_port = http_port
        self.grpc_url = f"127.0.0.1:{grpc_port}"
        self._http: http.client.HTTPConnection | None = None
        self._http_used = 0.0
        self._grpc_client: grpcclient.InferenceServerClient | None = None
        self._calls = 0

    def connection(self) -> http.client.HTTPConnection:
        if self._http is not None and time.monotonic() - self._http_used > IDLE_S:
            self._http.close()  # the server may be closing it right now
            self._http = None
        if self._http is None:
            self._http = http.client.HTTPConnection(
                "127.0.0.1", self.http_port, timeout=CALL_TIMEOUT_S
            )
        self._http_used = time.monotonic()
        return self._http

    def grpc(self) -> grpcclient.InferenceServerClient:
        if self._grpc_client is None:
            self._grpc_client = grpcclient.InferenceServerClient(self.grpc_url)
        return self._grpc_client

    def renew(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._grpc_client is not None:
            self._grpc_client.close()
        self._http = self._grpc_client = None

    def close(self) -> None:
        self.renew()

    def send(self, case: Case, mode: str) -> Answer:
        self._calls += 1
        if self._calls % self.RENEW_AFTER == 0:
            self.renew()
        try:
            answer = getattr(self, f"_{mode}")(case)
        except TimeoutError as exc:
            answer = Answer("no_answer", detail=f"{type(exc).__name__}: {exc}")
        except (OSError, http.client.HTTPException) as exc:
            answer = Answer("lost", detail=f"{type(exc).__name__}: {exc}")
        except InferenceServerException as exc:
            answer = _grpc_error(exc)
        if answer.status in ("lost", "no_answer", "UNAVAILABLE"):
            self.renew()
        return answer

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> http.client.HTTPResponse:
        connection = self.connection()
        connection.request("POST", path, body=body, headers=headers)
        return connection.getresponse()

    # -- HTTP ------------------------------------------------------------------------------------

    def _http_json(self, case: Case) -> Answer:
        return self._http_infer(case, binary=False)

    def _http_binary(self, case: Case) -> Answer:
        return self._http_infer(case, binary=True)

    def _http_infer(self, case: Case, binary: bool) -> Answer:
        body, headers = infer_body(case, binary)
        r = self._post(f"/v2/models/{case.model}/infer", body, headers)
        data = r.read()
        if r.status != 200:
            return Answer(str(r.status), detail=data[:300].decode(errors="replace"))
        try:
            version, outs = infer_outputs(data, r.getheader("inference-header-content-length"))
        except (ValueError, KeyError, TypeError) as exc:
            return Answer("200", detail=f"unreadable answer ({exc}): {data[:300]!r}")
        return Answer("200", version, outs)

    def _http_generate(self, case: Case) -> Answer:
        """text_stats through `generate`: one text, its outputs as JSON fields."""
        if len(case.texts) != 1:  # generate carries one text: a batch goes as tensors
            return self._http_infer(case, binary=True)
        body = json.dumps({"text": case.texts[0]}).encode()
        r = self._post(
            f"/v2/models/{case.model}/generate", body, {"content-type": "application/json"}
        )
        data = r.read()
        if r.status != 200:
            return Answer(str(r.status), detail=data[:300].decode(errors="replace"))
        doc = json.loads(data)
        outs = {
            "upper": np.array([[str(doc["upper"]).encode()]], dtype=object),
            "length": np.array([[doc["length"]]], dtype=np.int32),
        }
        return Answer("200", str(doc["model_version"]), outs)

    def _http_stream(self, case: Case) -> Answer:
        """word_stream through `generate_stream`: one server-sent event per word."""
        (text,) = case.inputs["text_input"][0].tolist()
        body = json.dumps({"text_input": text.decode()}).encode()
        r = self._post(
            f"/v2/models/{case.model}/generate_stream", body, {"content-type": "application/json"}
        )
        if r.status != 200:
            return Answer(str(r.status), detail=r.read()[:300].decode(errors="replace"))
        words: list[bytes] = []
        version = ""
        for line in r.read().decode().splitlines():  # the stream ends with the response
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                return Answer("200", detail=f"stream error event: {event['error']}"[:300])
            version = str(event["model_version"])
            words.append(str(event["text_output"]).encode())
        return Answer("200", version, {"text_output": np.array(words, dtype=object)})

    # -- gRPC ------------------------------------------------------------------------------------

    def _grpc_inputs(self, case: Case) -> list[grpcclient.InferInput]:
        inputs = []
        for name, (array, datatype) in case.inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs

    def _grpc(self, case: Case) -> Answer:
        outputs = [grpcclient.InferRequestedOutput(n) for n in case.outputs]
        result = self.grpc().infer(
            case.model, self._grpc_inputs(case), outputs=outputs, client_timeout=CALL_TIMEOUT_S
        )
        outs = {n: result.as_numpy(n) for n in case.outputs}
        return Answer("OK", result.get_response().model_version, outs)

    def _grpc_stream(self, case: Case) -> Answer:
        """A stream of its own (a new channel: streams are not shared by the soak's calls)
        carrying one request; read until its final response or the deadline."""
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.grpc_url)
        parts: dict[str, list[np.ndarray]] = {n: [] for n in case.outputs}
        version = ""
        try:
            client.start_stream(
                callback=lambda result, error: answers.put((result, error)),
                stream_timeout=CALL_TIMEOUT_S,
            )
            client.async_stream_infer(
                case.model, self._grpc_inputs(case), request_id="1",
                enable_empty_final_response=True,
            )  # fmt: skip
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while True:
                try:
                    result, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    return Answer("no_answer", detail="no final response within the deadline")
                if error is not None:
                    return _grpc_error(error)
                response = result.get_response()
                if response.outputs:
                    version = response.model_version
                    for n in case.outputs:
                        parts[n].append(result.as_numpy(n))
                if response.parameters["triton_final_response"].bool_param:
                    break
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()
        if any(not p for p in parts.values()):
            return Answer("OK", version, detail="the stream ended without outputs")
        outs = {n: np.concatenate(p) for n, p in parts.items()}
        return Answer("OK", version, outs)
