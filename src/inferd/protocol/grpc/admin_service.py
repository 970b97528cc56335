"""Routing administration over gRPC (`inferd.admin.v1.Admin`), beside Triton's service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson

from inferd.dataplane.plane import DataPlane
from inferd.errors import InferdError, invalid
from inferd.protocol.grpc.error_status import abort

ADMIN_SERVICE = "inferd.admin.v1.Admin"


class AdminService:
    """Routing administration over gRPC: `/inferd.admin.v1.Admin/<Method>` with JSON
    messages (no .proto to compile; any gRPC client can call it with a bytes codec).

    GetRouting {"model"} · SetRouting {"model", "weights"} · Promote {"model", "version"} ·
    Rollback {"model", "version"?} -> the model's routing as JSON.
    GetDrift {"model", "version"?} -> the drift report (docs/monitoring.md).
    """

    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {
            "GetRouting": lambda doc: self.dp.admin.routing(_str(doc, "model")),
            "SetRouting": lambda doc: self.dp.admin.set_routing(
                _str(doc, "model"), doc.get("weights")
            ),
            "Promote": lambda doc: self.dp.admin.promote(_str(doc, "model"), _str(doc, "version")),
            "Rollback": lambda doc: self.dp.admin.rollback(
                _str(doc, "model"), str(doc.get("version", ""))
            ),
            "GetDrift": lambda doc: self.dp.admin.drift(
                _str(doc, "model"), str(doc.get("version", ""))
            ),
        }
        return grpc.method_handlers_generic_handler(
            ADMIN_SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    self._wrap(fn), request_deserializer=_json_in, response_serializer=orjson.dumps
                )
                for name, fn in methods.items()
            },
        )

    @staticmethod
    def _wrap(
        fn: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[dict[str, Any]]]:
        async def call(doc: Any, context: grpc.aio.ServicerContext) -> dict[str, Any]:
            try:
                if not isinstance(doc, dict):
                    raise invalid("the request must be a JSON object")
                return fn(doc)
            except InferdError as exc:
                await abort(context, exc)

        return call


def _json_in(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return None


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str | int) or value == "":
        raise invalid(f"'{key}' is required")
    return str(value)
