"""The gRPC adapter: Triton's `inference.GRPCInferenceService` over the DataPlane.

Messages and the servicer base come generated in `tritonclient.grpc`. Like the HTTP adapter,
it only translates; every method's failures go through one rule (protocol/grpc/error_status.py).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.dataplane.access import ApiGroup
from inferd.dataplane.plane import DataPlane
from inferd.limits import DEFAULT_LIMITS, Limits
from inferd.protocol.grpc.access_interceptor import TRITON_METHOD_GROUPS, AccessInterceptor
from inferd.protocol.grpc.admin_service import ADMIN_SERVICE, AdminService
from inferd.protocol.grpc.handlers import add_inference_servicer
from inferd.protocol.grpc.model_infer import ModelInferMethod, errors_mapped
from inferd.protocol.grpc.protobuf_codec import (
    parameters_to_dict,
)
from inferd.protocol.grpc.stream_infer import StreamInferMethod
from inferd.protocol.offload import Offload
from inferd.protocol.tls import grpc_credentials
from inferd.settings import TlsFiles

log = logging.getLogger("inferd.grpc")


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Every method of Triton's service; the two inference methods are parts of their own
    (model_infer.py, stream_infer.py), the others translate here."""

    def __init__(
        self,
        dataplane: DataPlane,
        limits: Limits = DEFAULT_LIMITS,
        offload: Offload | None = None,
        max_response_bytes: int = 0,
    ) -> None:
        self.dp = dataplane
        offload = offload or Offload(limits.offload_bytes)
        self.unary = ModelInferMethod(dataplane, limits, offload, max_response_bytes)
        self.streaming = StreamInferMethod(dataplane, limits, offload, max_response_bytes)
        # Bound here, as the DataPlane binds its steps: gRPC calls the part's method itself.
        self.ModelInfer = self.unary.ModelInfer
        self.ModelStreamInfer = self.streaming.ModelStreamInfer

    @errors_mapped
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dp.health.live())

    @errors_mapped
    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dp.health.ready())

    @errors_mapped
    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=self.dp.health.model_ready(request.name, request.version)
        )

    @errors_mapped
    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.dp.metadata.server_metadata())

    @errors_mapped
    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        meta = self.dp.metadata.model_metadata(request.name, request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]],
            outputs=[tensor(**t) for t in meta["outputs"]],
        )

    @errors_mapped
    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=self.dp.metadata.model_config(request.name, request.version)
        )

    @errors_mapped
    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        rows = self.dp.metadata.repository_index(request.ready)
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[index(**row) for row in rows])

    @errors_mapped
    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        doc = await self.dp.statistics.server_statistics(request.name, request.version)
        # Fields inferd adds (a degraded model's `degradation`) have no place in Triton's
        # message: HTTP's JSON carries them.
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    @errors_mapped
    async def RepositoryModelLoad(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self.dp.admin.load_model(request.model_name, _parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @errors_mapped
    async def RepositoryModelUnload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self.dp.admin.unload_model(request.model_name, _parameters(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    @errors_mapped
    async def SystemSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        regions = self.dp.admin.shared_memory_status(request.name)
        return pb.SystemSharedMemoryStatusResponse(
            regions={r["name"]: status(**r) for r in regions}
        )

    @errors_mapped
    async def SystemSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.dp.admin.register_shared_memory(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @errors_mapped
    async def SystemSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.dp.admin.unregister_shared_memory(request.name)  # "" unregisters every region
        return pb.SystemSharedMemoryUnregisterResponse()

    @errors_mapped
    async def CudaSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        self.dp.admin.cuda_shared_memory_status(request.name)  # empty, or NOT_FOUND for a name
        return pb.CudaSharedMemoryStatusResponse()

    @errors_mapped
    async def CudaSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self.dp.admin.register_cuda_shared_memory()
        return pb.CudaSharedMemoryRegisterResponse()

    @errors_mapped
    async def CudaSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing can be registered

    @errors_mapped
    async def TraceSetting(self, request: Any, context: Any) -> pb.TraceSettingResponse:
        # A setting without values is Triton's "clear" (JSON null).
        changes = {key: list(value.value) or None for key, value in request.settings.items()}
        doc = self.dp.runtime.trace_settings(request.model_name, changes)
        response = pb.TraceSettingResponse()
        for key, value in doc.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @errors_mapped
    async def LogSettings(self, request: Any, context: Any) -> pb.LogSettingsResponse:
        doc = self.dp.runtime.log_settings(parameters_to_dict(request.settings))
        response = pb.LogSettingsResponse()
        for key, value in doc.items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response


def _parameters(parameters: Any) -> dict[str, Any]:
    """A repository call's ModelRepositoryParameter map as plain values."""
    values: dict[str, Any] = {}
    for key, value in parameters.items():
        which = value.WhichOneof("parameter_choice")
        values[key] = getattr(value, which) if which else None
    return values


# Triton's API group of each method (what --grpc-restricted-protocol names); the routing
# service counts as model-repository.
METHOD_GROUPS: dict[str, ApiGroup] = {
    **TRITON_METHOD_GROUPS,
    **{
        f"/{ADMIN_SERVICE}/{m}": ApiGroup.MODEL_REPOSITORY
        for m in ("GetRouting", "SetRouting", "Promote", "Rollback")
    },
    f"/{ADMIN_SERVICE}/GetDrift": ApiGroup.STATISTICS,  # as HTTP's GET .../drift
}


def build_server(
    dataplane: DataPlane,
    host: str,
    port: int,
    max_receive_bytes: int,
    max_send_bytes: int,
    reuse_port: bool = False,
    tls: TlsFiles | None = None,
    limits: Limits = DEFAULT_LIMITS,
    offload: Offload | None = None,
) -> tuple[grpc.aio.Server, int, InferenceServicer]:
    """A grpc.aio server on the running loop; returns it with the port actually bound and
    its servicer.

    Received messages past the limit fail with RESOURCE_EXHAUSTED, raised by gRPC itself;
    responses past it are refused by inferd before they are built (gRPC's own send limit
    stays as a backstop).
    `reuse_port`: share the port with sibling workers (the kernel spreads connections).
    `tls`: serve TLS (mTLS when it names a client CA) instead of plaintext.
    """
    guarded = any(dataplane.access.guards("grpc", g) for g in set(METHOD_GROUPS.values()))
    server = grpc.aio.server(
        # No interceptor when nothing is restricted: unrestricted calls pay nothing.
        interceptors=[AccessInterceptor(dataplane.access, METHOD_GROUPS)] if guarded else None,
        options=[
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    servicer = InferenceServicer(dataplane, limits, offload, max_send_bytes)
    add_inference_servicer(servicer, server)
    server.add_generic_rpc_handlers((AdminService(dataplane).handler(),))
    address = host if host.startswith("unix:") else f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, grpc_credentials(tls))
    return server, bound, servicer
