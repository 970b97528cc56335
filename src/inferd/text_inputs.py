"""BYTES inputs a model reads as UTF-8 text: declared once at load, checked per request.

ONNX Runtime string inputs are text by nature (the registry marks them); a Python model says
so with the config parameter `text_inputs`. Either way, a request whose bytes are not UTF-8
gets a 400 naming the input and element before it joins a batch of others' requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tritonclient.grpc import model_config_pb2 as mc

from inferd.errors import invalid
from inferd.repository.config import ConfigError
from inferd.types import Array

if TYPE_CHECKING:
    from inferd.signature import TensorSpec

TEXT_INPUTS = "text_inputs"  # "a,b": BYTES inputs the model reads as UTF-8 text


def declared_text_inputs(
    config: mc.ModelConfig, inputs: Mapping[str, TensorSpec]
) -> frozenset[str]:
    """The config's `text_inputs` parameter: BYTES inputs a model (a Python one) decodes as
    UTF-8, so a request whose bytes are not is the request's 400, found before it joins a
    batch of others' requests, rather than an exception failing that batch."""
    if TEXT_INPUTS not in config.parameters:
        return frozenset()
    raw = str(config.parameters[TEXT_INPUTS].string_value)
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    for name in sorted(names):
        spec = inputs.get(name)
        if spec is None or spec.datatype != "BYTES":
            raise ConfigError(
                f"{config.name}/config.pbtxt: parameters: {TEXT_INPUTS}: '{name}' is not a "
                "TYPE_STRING (BYTES) input of the model"
            )
    return names


def check_utf8(name: str, flat: Array) -> None:
    """Raise INVALID_ARGUMENT naming the first element of `flat` that is not UTF-8."""
    if _all_utf8(flat):
        return
    for j, value in enumerate(flat):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(
                f"input '{name}': BYTES element {j} is not UTF-8 text, which this model requires"
            ) from None
        except AttributeError:
            continue


def _all_utf8(flat: Array) -> bool:
    """Whether every element is UTF-8, in two C calls rather than one per element (this runs
    on the event loop): a NUL between elements cannot complete a sequence one of them cut
    short, so the joined bytes are UTF-8 exactly when each element is. False also when an
    element is not bytes: the caller's walk then tells them apart."""
    try:
        b"\0".join(flat).decode("utf-8")
    except (UnicodeDecodeError, TypeError):
        return False
    return True
