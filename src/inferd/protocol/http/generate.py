"""Triton's generate extension over the DataPlane's streaming steps (dataplane/decoupled.py).

`POST /v2/models/{m}[/versions/{v}]/generate` answers one JSON object; `.../generate_stream`
answers server-sent events (`text/event-stream`), one `data: {...}` event per response, as the
model sends them. Both work for any model: one that is not decoupled sends one response.

The request is a JSON object. A top-level key that names one of the model's inputs is that
input: a value or a flat list, shaped from the model's metadata shape as Triton does (fixed
dimensions divide the element count, the innermost -1 takes the rest, any other -1 is 1).
Every other key, and each key of `parameters` that names no input, is a request parameter (a
string, number or boolean; `priority` and `timeout` schedule it, a Python model reads the
rest). A response is a JSON object: `model_name`, `model_version`, its parameters, and each
output as a top-level key (one element: the value; more: a flat list).

A failure before the first response is an ordinary error reply (status and
`{"error": ...}`); after it, an event `data: {"error": ...}` (the status line has gone).
A client that disconnects cancels the request: a decoupled model reads `is_cancelled()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from inferd.dataplane.access import ApiGroup
from inferd.dataplane.plane import DataPlane
from inferd.errors import ErrorKind, InferdError, invalid
from inferd.events import CallContext
from inferd.protocol.http.error_responses import http_error
from inferd.protocol.http.rest_codec import decode_json_input, tensor_json
from inferd.streams import StreamResponse
from inferd.types import InferRequest, InferResponse, Tensor

_JSON = b"application/json"
_EVENTS = b"text/event-stream; charset=utf-8"
ReadBody = Callable[[Receive, str | None, int], Awaitable[bytes]]


class GenerateEndpoint:
    """An ASGI app for one of the two routes (`streaming`: generate_stream). The HTTP
    adapter hands it its body reader and deadline header parser."""

    def __init__(
        self,
        dataplane: DataPlane,
        max_request_bytes: int,
        streaming: bool,
        read_body: ReadBody,
        deadline_ns: Callable[[str | None, int], int | None],
    ) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes
        self.streaming = streaming
        self._read_body = read_body
        self._deadline_ns = deadline_ns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        model, version = params["model"], params.get("version", "")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client")
        start_ns = time.perf_counter_ns()
        ctx = CallContext(
            "http",
            f"{client[0]}:{client[1]}" if client else "",
            headers.get("traceparent", ""),
            time.time(),
            start_ns,
            headers.get("inferd-routing-key", ""),
        )
        handler = asyncio.current_task()
        watcher: asyncio.Task[None] | None = None
        try:
            with self.dp.start_stream(model, version, ctx) as call:
                self.dp.admit_stream(call)
                # A restricted inference group covers generate too (Triton's rule).
                self.dp.access.check("http", ApiGroup.INFERENCE, lambda name: headers.get(name))
                ctx.deadline_ns = self._deadline_ns(headers.get("inferd-timeout-ms"), start_ns)
                body = await self._read_body(
                    receive, headers.get("content-length"), self.max_request_bytes
                )
                if handler is not None:
                    # The body is in: the next message is the client hanging up, which
                    # cancels the request (a decoupled model sees is_cancelled()).
                    watcher = asyncio.create_task(_cancel_on_disconnect(receive, handler))
                inputs = self.dp.metadata.model_metadata(model, version)["inputs"]
                request = generate_request(body, model, version, inputs)
                items = await self.dp.stream(call, request)
            async with contextlib.aclosing(items):
                if self.streaming:
                    await self._stream(items, send)
                else:
                    await self._answer_once(items, send)
        except InferdError as exc:
            error = http_error(exc)
            await _reply(send, error.status, _JSON, error.body, error.headers)
        except asyncio.CancelledError:
            if handler is None or watcher is None or not watcher.done():
                raise
            handler.uncancel()  # the client has gone: nobody to answer
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _answer_once(self, items: AsyncGenerator[StreamResponse, None], send: Send) -> None:
        """Exactly one response, as Triton's generate: a model that sends none, or a second
        one, is told to use generate_stream (its stream is cancelled at the second)."""
        answer: InferResponse | None = None
        async for item in items:
            if item.error is not None:
                raise item.error
            if item.response is not None:
                if answer is not None:
                    raise _not_one_response(answer.model_name, "more than one response")
                answer = item.response
        if answer is None:
            raise _not_one_response("", "no response")
        await _reply(send, 200, _JSON, response_json(answer))

    async def _stream(self, items: AsyncGenerator[StreamResponse, None], send: Send) -> None:
        # The first item decides the status: an error before any response raises here.
        first = await anext(items)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", _EVENTS), (b"cache-control", b"no-cache")],
            }
        )
        item: StreamResponse | None = first
        while item is not None:
            event = _event(item)
            if event:
                # Awaits the client's socket: a slow reader holds the model's sender back.
                await send({"type": "http.response.body", "body": event, "more_body": True})
            item = None if item.final else await anext(items, None)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def generate_request(
    body: bytes, model: str, version: str, inputs: list[dict[str, Any]]
) -> InferRequest:
    """The generate JSON body as an InferRequest, by Triton's mapping (module docstring)."""
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise invalid(f"malformed JSON request: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid("malformed request: the generate body must be a JSON object")
    specs = {spec["name"]: spec for spec in inputs}
    tensors: list[Tensor] = []
    parameters: dict[str, Any] = {}
    nested = doc.pop("parameters", None)
    if nested is not None and not isinstance(nested, dict):
        raise invalid("'parameters' must be an object")
    if nested is not None and "parameters" in specs:
        raise invalid("keyword 'parameters' for nested parameters is also an input's name")
    for source in (doc, nested or {}):
        for key, value in source.items():
            spec = specs.get(key)
            if spec is not None:
                tensors.append(_input(spec, value, len(tensors)))
            elif isinstance(value, str | int | float | bool):
                parameters[key] = value
            else:
                raise invalid(
                    f"'{key}' names no input of model '{model}', so it is a request parameter, "
                    f"which must be a string, number or boolean (inputs: {', '.join(specs)})"
                )
    if not tensors:
        raise invalid(
            f"the generate request names none of model '{model}''s inputs: "
            f"{', '.join(specs) or '(none)'}"
        )
    return InferRequest(model, version, tensors, parameters=parameters)


def _input(spec: dict[str, Any], value: Any, index: int) -> Tensor:
    name = spec["name"]
    data = value if isinstance(value, list) else [value]
    if any(isinstance(v, list | dict) for v in data):
        raise invalid(f"input '{name}': generate takes a value or a flat list, not nested data")
    shape = _shape(name, list(spec["shape"]), len(data))
    raw = {"name": name, "datatype": spec["datatype"], "shape": shape, "data": data}
    return decode_json_input(raw, index)


def _shape(name: str, dims: list[int], count: int) -> list[int]:
    """Triton's rule: fixed dims divide the count, the innermost -1 takes what remains."""
    remaining = count
    for d in dims:
        if d != -1:
            if d == 0 or remaining % d:
                raise invalid(
                    f"input '{name}': {count} elements do not fit its shape {dims} "
                    "(the schema can not convert it to a tensor with proper shape)"
                )
            remaining //= d
    shape = list(dims)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], remaining = remaining, 1
    if remaining != 1:
        raise invalid(f"input '{name}': {count} elements do not fit its shape {dims}")
    return shape


def response_json(response: InferResponse) -> bytes:
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        **response.parameters,
    }
    for tensor in response.outputs:
        data = tensor_json(tensor)
        if data is None:
            raise InferdError(
                ErrorKind.MODEL_ERROR,
                f"output '{tensor.name}' holds bytes that are not UTF-8 text, which the "
                "generate extension's JSON cannot carry; use /infer or gRPC for it",
            )
        doc[tensor.name] = data[0] if len(data) == 1 else data
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _event(item: StreamResponse) -> bytes:
    """One server-sent event: the response, an error, or nothing for the final flag alone."""
    if item.response is not None:
        try:
            return b"data: " + response_json(item.response) + b"\n\n"
        except InferdError as exc:
            return b"data: " + http_error(exc).body + b"\n\n"
    if item.error is not None:
        return b"data: " + http_error(item.error).body + b"\n\n"
    return b""


def _not_one_response(model: str, got: str) -> InferdError:
    return invalid(
        f"generate expects the model to produce exactly 1 response, and it sent {got}; "
        "use generate_stream for a model that sends any number of responses"
    )


async def _reply(
    send: Send,
    status: int,
    content_type: bytes,
    body: bytes,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _cancel_on_disconnect(receive: Receive, handler: asyncio.Task[Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            handler.cancel()
            return
