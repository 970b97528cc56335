"""What the server and its models are: Triton's server and model metadata, model
configuration and repository index."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inferd import __version__
from inferd.config.model_config import with_kinds_used
from inferd.repository.registry import ModelRegistry
from inferd.tensors.signature import TensorSpec

EXTENSIONS = [
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "sequence",
    "statistics",
    "system_shared_memory",
    "trace",
    "logging",
]


class Metadata:
    def __init__(self, registry: ModelRegistry, processes: int = 1) -> None:
        """`processes`: the server processes of `--workers N` that serve the repository."""
        self.registry = registry
        # System shared memory needs one process (admin.py's gate): not offered otherwise.
        self.extensions = (
            EXTENSIONS if processes == 1 else [e for e in EXTENSIONS if e != "system_shared_memory"]
        )

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "inferd", "version": __version__, "extensions": self.extensions}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        mv = self.registry.get(name, version)
        sig = mv.signature
        model = self.registry.models[name]
        versions = (
            [version]
            if version
            else sorted((v.version for v in model.versions.values() if v.is_ready), key=int)
        )
        return {
            "name": name,
            "versions": versions,
            "platform": mv.config.platform or mv.config.backend,
            "inputs": [_tensor_meta(s, sig.metadata_shape(s)) for s in sig.inputs.values()],
            "outputs": [_tensor_meta(s, sig.metadata_shape(s)) for s in sig.outputs.values()],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        """The served version's config, with its files' checksum as parameter
        `model_checksum` (to check what is deployed, field lesson 16), and each instance
        group's kind as actually used (KIND_GPU without a GPU reads KIND_CPU)."""
        mv = self.registry.get(name, version)
        config = mc.ModelConfig()
        config.CopyFrom(mv.config)
        with_kinds_used(config, mv.devices)
        config.parameters["model_checksum"].string_value = mv.checksum
        return config

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows = self.registry.index(ready_only)
        if not ready_only:
            # As Triton: models in the repository that are not loaded are listed by name.
            listed = {r["name"] for r in rows}
            try:
                on_disk = self.registry.model_names_on_disk()
            except OSError:
                on_disk = []
            rows += [{"name": n} for n in on_disk if n not in listed]
            rows.sort(key=lambda r: (r["name"], int(r.get("version", 0))))
        return rows


def _tensor_meta(spec: TensorSpec, shape: list[int]) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": shape}
