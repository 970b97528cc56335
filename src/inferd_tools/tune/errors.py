from __future__ import annotations


class TuneError(Exception):
    """A problem the user must fix (admin API off, unknown model, unreachable server)."""
