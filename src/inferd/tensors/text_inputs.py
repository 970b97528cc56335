"""BYTES inputs a model reads as UTF-8 text: declared once at load, checked per request.

ONNX Runtime string inputs are text by nature (the registry marks them); a Python model says
so with the config parameter `text_inputs` (parsed with the model's spec,
`repository/spec.py`). Either way, a request whose bytes are not UTF-8
gets a 400 naming the input and element before it joins a batch of others' requests.
"""

from __future__ import annotations

from inferd.errors import invalid
from inferd.types import Array


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
