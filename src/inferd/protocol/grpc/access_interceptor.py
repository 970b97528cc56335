"""The admin gate on gRPC: an interceptor that checks each call's metadata against the
DataPlane's access policy, for its method's API group, before the method runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from inferd.dataplane.access import AccessPolicy, ApiGroup
from inferd.errors import InferdError
from inferd.protocol.grpc.error_status import abort

_SERVICE = "/inference.GRPCInferenceService/"
TRITON_METHOD_GROUPS: dict[str, ApiGroup] = {
    **{_SERVICE + m: ApiGroup.HEALTH for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{_SERVICE + m: ApiGroup.METADATA for m in ("ServerMetadata", "ModelMetadata")},
    **{_SERVICE + m: ApiGroup.INFERENCE for m in ("ModelInfer", "ModelStreamInfer")},
    _SERVICE + "ModelConfig": ApiGroup.MODEL_CONFIG,
    _SERVICE + "ModelStatistics": ApiGroup.STATISTICS,
    **{
        _SERVICE + m: ApiGroup.MODEL_REPOSITORY
        for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
    },
    **{
        f"{_SERVICE}{kind}SharedMemory{op}": ApiGroup.SHARED_MEMORY
        for kind in ("System", "Cuda")
        for op in ("Status", "Register", "Unregister")
    },
    _SERVICE + "TraceSetting": ApiGroup.TRACE,
    _SERVICE + "LogSettings": ApiGroup.LOGGING,
}


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Methods of a restricted group answer only calls with its credential (streams: checked
    once, when they open). Methods missing from `groups` are not checked."""

    def __init__(
        self,
        access: AccessPolicy,
        groups: dict[str, ApiGroup],
    ) -> None:
        self.access = access
        self.groups = groups

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        group = self.groups.get(details.method)
        handler = await continuation(details)
        if group is None or handler is None or not self.access.guards("grpc", group):
            return handler
        metadata = {k: v for k, v in details.invocation_metadata or () if isinstance(v, str)}
        try:
            self.access.check("grpc", group, metadata.get)
        except InferdError as exc:
            return _refusal(handler, exc)
        return handler


def _refusal(handler: Any, exc: InferdError) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s kind that answers `exc` without running the method."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await abort(context, exc)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
