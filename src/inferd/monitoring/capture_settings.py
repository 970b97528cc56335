"""What capture and feedback are asked to do: per model (the config's parameters, parsed by
repository/spec.py) and per server (`--capture-dir`, `--capture-max-mib`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_ACCURACY_WINDOW = 1000  # labelled rows
DEFAULT_FEEDBACK_TTL_S = 3600.0
DEFAULT_CAPTURE_MAX_BYTES = 1024 * 1024 * 1024
DEFAULT_REDIS_STREAM = "inferd:capture"
DEFAULT_REDIS_MAXLEN = 10_000


class CaptureOptionError(ValueError):
    """A capture option inferd cannot honour; the message names it."""


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """A model's `capture_sample_rate`, `accuracy_window`, `accuracy_output`, `feedback_ttl_s`,
    `canary_accuracy_margin`."""

    sample_rate: float = 0.0  # share of answered requests captured (0: none)
    accuracy_window: int = DEFAULT_ACCURACY_WINDOW  # labelled rows the accuracy is over
    accuracy_output: str = ""  # the class output feedback is judged on; "": the first output
    feedback_ttl_s: float = DEFAULT_FEEDBACK_TTL_S  # how long a prediction waits for its label
    # With canary_auto_rollback: a canary whose accuracy is below stable's by more than this
    # loses its traffic (None: accuracy never rolls back).
    accuracy_margin: float | None = None


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    """The server's side: where sampled requests are written (`--capture-dir`, and/or
    `--capture-redis`), and how much may pile up."""

    directory: Path | None = None  # None: captures feed feedback only, nothing is written
    max_bytes: int = DEFAULT_CAPTURE_MAX_BYTES  # shards on disk past it: the oldest go
    redis_url: str = ""  # --capture-redis: also to this Redis ("": not)
    redis_stream: str = DEFAULT_REDIS_STREAM  # the stream's key
    redis_maxlen: int = DEFAULT_REDIS_MAXLEN  # entries the stream keeps (XADD MAXLEN)

    @property
    def shard_bytes(self) -> int:
        """A shard is closed past an eighth of the bound, so dropping the oldest keeps most."""
        return max(1, self.max_bytes // 8)
