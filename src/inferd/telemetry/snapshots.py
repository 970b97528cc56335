"""Reading, from a scrape thread, the dicts the event loop adds keys to.

Iterating such a dict from Python while the loop inserts fails with "dictionary changed size
during iteration", and so, rarely, can `list(d.items())` or `sorted(d.items())`: they
allocate a tuple per item, an allocation can start the garbage collector, and its callbacks
are Python code, where the interpreter may switch threads mid-copy. `list(d)` allocates
nothing per key, so no thread runs while it copies: the keys first, then each value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def items(shared: Mapping[K, V]) -> list[tuple[K, V]]:
    """The (key, value) pairs of `shared` as of now; a key removed meanwhile is left out."""
    pairs = []
    for key in list(shared):
        value = shared.get(key)
        if value is not None:
            pairs.append((key, value))
    return pairs
