"""The few control calls a benchmark makes besides inference: model metadata, config (for
max_batch_size) and Triton's statistics, over HTTP or gRPC."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from inferd_tools.bench.errors import BenchError
from inferd_tools.bench.load import GRPC_OPTIONS


class ServerApi:
    """HTTP: `address` is http://host:port. gRPC: host:port."""

    def __init__(self, protocol: str, address: str, model: str, version: str) -> None:
        self.protocol = protocol
        self.address = address
        self.model = model
        self.version = version
        self._session: aiohttp.ClientSession | None = None
        self._channel: Any = None
        self._stub: Any = None

    async def __aenter__(self) -> ServerApi:
        if self.protocol == "grpc":
            import grpc
            from tritonclient.grpc import service_pb2_grpc

            self._channel = grpc.aio.insecure_channel(self.address, options=GRPC_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        else:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._channel is not None:
            await self._channel.close()

    @property
    def _model_path(self) -> str:
        version = f"/versions/{self.version}" if self.version else ""
        return f"/v2/models/{self.model}{version}"

    async def _get(self, path: str) -> Any:
        assert self._session is not None
        url = f"{self.address}{path}"
        try:
            async with self._session.get(url) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise BenchError(f"cannot reach the server at {self.address}: {e or type(e)}") from None
        try:
            doc = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            doc = {"error": body[:200].decode(errors="replace")}
        if status != 200:
            raise _StatusError(status, str(doc.get("error", doc) if isinstance(doc, dict) else doc))
        return doc

    async def metadata(self) -> dict[str, Any]:
        """Model metadata; a clear BenchError if the model is unknown or unreachable."""
        if self.protocol == "grpc":
            import grpc
            from google.protobuf import json_format
            from tritonclient.grpc import service_pb2 as pb

            try:
                response = await self._stub.ModelMetadata(
                    pb.ModelMetadataRequest(name=self.model, version=self.version), timeout=30
                )
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    raise BenchError(
                        f"cannot reach the server at {self.address}: {e.details()}"
                    ) from None
                raise BenchError(
                    f"model {self.model!r}: the server answered {e.code().name}: {e.details()}"
                ) from None
            doc: dict[str, Any] = json_format.MessageToDict(
                response, preserving_proto_field_name=True
            )
            for tensor in doc.get("inputs", []):
                tensor["shape"] = [int(d) for d in tensor.get("shape", [])]
            return doc
        try:
            result: dict[str, Any] = await self._get(self._model_path)
        except _StatusError as e:
            raise BenchError(
                f"model {self.model!r}: the server answered {e.status}: {e.message}"
            ) from None
        return result

    async def max_batch_size(self) -> int | None:
        """From the model config; None when the server has no config API (e.g. MLServer)."""
        try:
            if self.protocol == "grpc":
                from tritonclient.grpc import service_pb2 as pb

                response = await self._stub.ModelConfig(
                    pb.ModelConfigRequest(name=self.model, version=self.version), timeout=30
                )
                return int(response.config.max_batch_size)
            doc = await self._get(f"{self._model_path}/config")
            return int(doc.get("max_batch_size", 0))
        except Exception:
            return None

    async def statistics(self) -> list[dict[str, Any]] | None:
        """Triton's model_stats entries, or None when the server has no statistics API."""
        try:
            if self.protocol == "grpc":
                from google.protobuf import json_format
                from tritonclient.grpc import service_pb2 as pb

                response = await self._stub.ModelStatistics(
                    pb.ModelStatisticsRequest(name=self.model, version=self.version), timeout=30
                )
                doc = json_format.MessageToDict(response, preserving_proto_field_name=True)
            else:
                doc = await self._get(f"{self._model_path}/stats")
            stats = doc.get("model_stats")
            return list(stats) if isinstance(stats, list) else None
        except Exception:
            return None


class _StatusError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
