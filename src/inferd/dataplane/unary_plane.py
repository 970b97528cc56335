"""What the unary infer adapters (protocol/http/infer_route.py, protocol/grpc/model_infer.py) use
of the
core: the steps of unary.py and the access policy. The DataPlane has it; so has the
front end's `EngineClient` (engine/engine_client.py), which runs the steps in the engine process."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from inferd.dataplane.access import AccessPolicy
from inferd.errors import InferdError
from inferd.events import CallContext
from inferd.types import InferRequest, InferResponse


class UnaryPlane(Protocol):
    @property
    def access(self) -> AccessPolicy: ...

    def start(self, model_name: str, version: str, ctx: CallContext) -> AbstractContextManager[Any]:
        """The call, in flight within its `with`."""
        ...

    def admit(self, call: Any) -> None: ...

    async def refusal(self, call: Any, exc: InferdError) -> InferdError:
        """The error to answer an admitted request with that failed before `infer` (its
        body, or a header, could not be decoded): `exc`, unless admission, which comes
        first, refuses it (docs/reliability.md, "Which refusal comes first")."""
        ...

    async def infer(self, call: Any, request: InferRequest) -> InferResponse: ...

    def respond(self, call: Any, response: InferResponse) -> InferResponse: ...
