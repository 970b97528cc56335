from __future__ import annotations


class BenchError(Exception):
    """A problem the user must fix (bad option, unknown model, unreachable server)."""
