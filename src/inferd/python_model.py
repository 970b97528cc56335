"""The API a Python model implements: `model.py` defines a class named `Model`.

    class Model(inferd.PythonModel):
        def load(self, context):            # once per instance, before the first request
            ...
        def predict(self, inputs):          # a batch: {input name: array}, batch dim first
            return {"OUT": inputs["IN"] * 2}  # {output name: array}, same batch size
        def unload(self):                   # once, when the version is unloaded
            ...

`predict(self, inputs, parameters)` (the second parameter named `parameters`) also gets the
request parameters: a list with one mapping per row of the batch, the parameters of the
request the row came from. Any of the three may be `async def`. See docs/python-models.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.types import Array


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a Python model learns about itself at load time."""

    name: str
    version: str
    version_dir: Path  # the folder holding model.py: load weights relative to it
    max_batch_size: int
    parameters: dict[str, str]  # the config's `parameters` as plain strings
    instance_index: int
    config: Any  # the full Triton ModelConfig message, for anything else


class PythonModel:
    """Base class for Python models; subclassing it is optional, the method names are not."""

    def load(self, context: ModelContext) -> None:
        """Prepare the model; raising here marks the version UNAVAILABLE with the message."""

    def predict(self, inputs: dict[str, Array]) -> dict[str, Array]:
        """Compute every output for one batch; each output keeps the inputs' batch size."""
        raise NotImplementedError

    def unload(self) -> None:
        """Release what `load` acquired."""
