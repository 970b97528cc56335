"""`InferenceResponseSender`: how a decoupled model answers a request (Triton's decoupled mode).

A decoupled model (`model_transaction_policy { decoupled: true }`) gets one sender per request
from `request.get_response_sender()` and sends zero or more responses, then the final flag,
from any thread; the responses go to the request's response stream (inferd.streams).
"""

from __future__ import annotations

from collections.abc import Callable

from inferd.backends.pb_utils.errors import TritonModelException
from inferd.backends.pb_utils.messages import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponse,
)
from inferd.errors import InferdError
from inferd.streams import ResponseSink, StreamClosedError
from inferd.types import Array


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model, from any thread: zero or more
    `send(response)`, then `send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` (or the flag
    with the last response). A send may block while the client reads slower than the model
    sends; after the client left, sends are dropped and `is_cancelled()` is True."""

    def __init__(
        self, sink: ResponseSink, convert: Callable[[InferenceResponse], dict[str, Array]]
    ) -> None:
        self._sink = sink
        self._convert = convert  # a response's outputs, or raises InferdError

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}"
            )
        if response is not None and response.parameters_dict():
            raise TritonModelException(
                "InferenceResponse(parameters=...) is not supported for decoupled models yet: "
                "a streamed response carries outputs (or an error) only"
            )
        outputs: dict[str, Array] | None = None
        error: InferdError | None = None
        if response is not None:
            try:
                outputs = self._convert(response)
            except InferdError as exc:  # an error response, or one its config contradicts
                error = exc
        try:
            self._sink.send(outputs, error, flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except StreamClosedError:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed."
            ) from None

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled()
