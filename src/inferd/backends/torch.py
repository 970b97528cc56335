"""PyTorch backend: Triton's `pytorch_libtorch` platform (TorchScript `model.pt`) and
`torch.export` programs (`model.pt2`).

Only TorchScript archives and exported programs are loaded: never a pickled `nn.Module`,
which could run arbitrary code when unpickled.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.base import LoadContext
from inferd.config.model_config import ConfigError, instance_group_of
from inferd.datatypes import BF16, CONFIG_TO_V2, V2_TO_NUMPY
from inferd.tensors.conformance import OutputMismatchError
from inferd.types import Array

log = logging.getLogger("inferd.backends.torch")

# torch.export.load keeps global state while it deserialises: models loading in parallel
# threads must take turns.
_LOAD_LOCK = threading.Lock()

# Triton's convention: tensors named `<anything>__<index>` are matched by position.
_INDEXED = re.compile(r"^.+__(\d+)$")


def _indexes(names: list[str]) -> list[int] | None:
    matches = [_INDEXED.match(n) for n in names]
    if all(matches):
        return [int(m.group(1)) for m in matches if m]
    return None


class TorchBackend:
    model_file = "model.pt"
    model_files: tuple[str, ...] = ("model.pt", "model.pt2")
    decodes_bytes_as_text = False

    def complete_config(self, config: mc.ModelConfig, version_dir: Path) -> None:
        where = f"{config.name}/config.pbtxt"
        # A TorchScript file does not record its tensors' types: the config must declare them.
        if not config.input or not config.output:
            raise ConfigError(
                f"{where}: input/output: a PyTorch model must declare its inputs and outputs"
            )
        for t in list(config.input) + list(config.output):
            if t.data_type == mc.TYPE_STRING:
                raise ConfigError(f"{where}: '{t.name}': TYPE_STRING is not supported by PyTorch")

    def load(self, ctx: LoadContext) -> TorchInstance:
        return TorchInstance(ctx)


class TorchInstance:
    def __init__(self, ctx: LoadContext) -> None:
        config = ctx.config
        where = self._where = f"{ctx.model_name}/config.pbtxt"
        self._name = ctx.model_name
        self.device = self._choose_device(ctx)
        self.provider = "torch"
        settings = ctx.backend_settings()
        threads = settings.intra_op_threads(ctx.instance_count)
        # torch's intra-op pool is process-wide (Triton's libtorch backend sets it the same).
        torch.set_num_threads(threads)

        exported = ctx.version_dir / "model.pt2"
        if exported.exists():
            with _LOAD_LOCK:
                program = torch.export.load(str(exported))
            module: Any = program.module()
            self._arg_names = [
                s.arg.name
                for s in program.graph_signature.input_specs
                if s.kind.name == "USER_INPUT"
            ]
        else:
            path = ctx.version_dir / "model.pt"
            try:
                with _LOAD_LOCK:
                    module = torch.jit.load(str(path), map_location=self.device)  # type: ignore[no-untyped-call]
            except RuntimeError as exc:
                raise RuntimeError(
                    f"{ctx.model_name}/{ctx.version}/model.pt is not a TorchScript archive "
                    "(save it with torch.jit.save(torch.jit.script(model), ...) or use "
                    f"torch.export and model.pt2): {str(exc).splitlines()[0]}"
                ) from None
            module.eval()
            schema = module.forward.schema
            self._arg_names = [a.name for a in schema.arguments[1:]]  # after `self`
        if exported.exists():
            module = module.to(self.device)

        inputs = [t.name for t in config.input]
        order = _indexes(inputs)
        if order is None:
            missing = [n for n in inputs if n not in self._arg_names]
            if missing:
                raise ConfigError(
                    f"{where}: input '{missing[0]}' is not an argument of the model's forward "
                    f"({', '.join(self._arg_names)}); name inputs after the arguments or "
                    "use Triton's INPUT__<index> convention"
                )
            order = [self._arg_names.index(n) for n in inputs]
        if sorted(order) != list(range(len(order))):
            raise ConfigError(f"{where}: inputs must cover forward's arguments 0..{len(order) - 1}")
        # Arguments in forward's order, each naming the config input that feeds it.
        self._inputs = [name for _, name in sorted(zip(order, inputs, strict=True))]
        outputs = [t.name for t in config.output]
        self._output_names = outputs
        self._output_index = _indexes(outputs) or list(range(len(outputs)))

        compile_requested = settings.torch_compile
        if compile_requested:
            # dynamic=True: one graph serves every batch size instead of one compile per size.
            module = torch.compile(module, dynamic=config.max_batch_size > 0)
        self._module = module
        if compile_requested:
            # Compile now, never on the first request. torch specialises batch size 1, so
            # both a single row and a larger batch are run once.
            sizes = [1, 2] if config.max_batch_size >= 2 else [1]
            started = time.monotonic()
            for size in sizes:
                self._warm_up(config, size)
            log.info(
                "model %s: torch.compile warm-up took %.1fs",
                ctx.model_name,
                time.monotonic() - started,
            )

    def _choose_device(self, ctx: LoadContext) -> str:
        group, _, index_in_group = instance_group_of(ctx.config, ctx.instance_index)
        kind = group.kind
        gpus = list(group.gpus)
        if kind in (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO):
            if torch.cuda.is_available():
                return f"cuda:{gpus[index_in_group % len(gpus)] if gpus else 0}"
            if kind == mc.ModelInstanceGroup.KIND_GPU:
                # Field lesson 5: a fall back to CPU must be visible.
                log.warning(
                    "model %s v%s instance %d asked for KIND_GPU but CUDA is not available "
                    "to torch; running on CPU (the config API reports KIND_CPU)",
                    ctx.model_name,
                    ctx.version,
                    ctx.instance_index,
                )
        return "cpu"

    def _warm_up(self, config: mc.ModelConfig, batch_size: int) -> None:
        lead = [batch_size] if config.max_batch_size > 0 else []
        sample = {
            t.name: np.zeros(
                lead + [d if d > 0 else 1 for d in t.dims],
                V2_TO_NUMPY[CONFIG_TO_V2[t.data_type]],
            )
            for t in config.input
        }
        self.execute(sample)

    def execute(self, inputs: dict[str, Array]) -> dict[str, Array]:
        args = []
        for name in self._inputs:
            array = inputs[name]
            if not array.flags.writeable:
                array = array.copy()  # torch tensors must own writable memory
            args.append(_to_torch(array).to(self.device))
        with torch.inference_mode():
            result = self._module(*args)
        # A forward whose results do not cover the config's outputs fails every request:
        # say so (warm-up then keeps the version out of service) rather than an IndexError.
        declared = len(self._output_names)
        if isinstance(result, dict):
            missing = [n for n in self._output_names if n not in result]
            if missing:
                raise OutputMismatchError(
                    f"forward() returned no '{missing[0]}', which {self._where} declares "
                    f"(it returned {', '.join(map(str, result)) or 'none'})"
                )
            values = [result[n] for n in self._output_names]
        elif isinstance(result, (tuple, list)):
            if len(result) <= max(self._output_index):
                raise OutputMismatchError(
                    f"forward() returned {len(result)} tensors, but {self._where} declares "
                    f"{declared} outputs"
                )
            values = [result[i] for i in self._output_index]
        elif declared != 1:
            raise OutputMismatchError(
                f"forward() returned one tensor, but {self._where} declares {declared} outputs"
            )
        else:
            values = [result]
        return {
            name: _to_numpy(value.detach().cpu())
            for name, value in zip(self._output_names, values, strict=True)
        }

    def close(self) -> None:
        self.__dict__.pop("_module", None)  # idempotent: closing twice is harmless
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


# numpy has no bfloat16 and torch does not know ml_dtypes' one: BF16 crosses between them
# as its 16-bit patterns (views both ways, no conversion of values).


def _to_torch(array: Array) -> torch.Tensor:
    if array.dtype == BF16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(tensor: torch.Tensor) -> Array:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BF16)
    return tensor.numpy()
