"""The errors `inferd optimize` tells apart, each with its exit code."""

from __future__ import annotations

# Exit codes (docs/optimize.md): 0 a winner (published when asked), 1 publishing or the
# server step failed, 2 bad input, 3 no eligible candidate.
EXIT_OK = 0
EXIT_PUBLISH_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_WINNER = 3


class OptimizeError(Exception):
    """Bad input the user must fix: the message names the option, file or field."""


class PublishError(Exception):
    """Publishing the winner, or the server step after it, failed."""
