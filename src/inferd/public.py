"""What code outside the server may rely on: the tools (`inferd_tools`: `inferd bench`,
`inferd tune`, `inferd optimize`) and users' scripts.

Everything else in `inferd` is the server's own and may change shape without notice; the
names below keep their meaning, and a change to one is a change to the project's interface
(tests/unit/test_public_surface.py fails when a tool imports anything else). The model
author's API (`PythonModel` and friends) is `inferd.__all__`.

- `ADMIN_TOKEN_ENV`: the environment variable holding the admin token that `inferd serve`
  reads and the tools send as `authorization: Bearer <token>`.
- `read_config`, `ConfigError`: a model directory's `config.pbtxt` parsed into Triton's
  `ModelConfig` message, as the server parses it (errors name the file and the field).
- `backend_name`, `instance_count`, `int_parameter`: what the server reads from such a
  config: the backend, the number of instances, an integer `parameters` entry;
  `group_waste`: a `pad_grouping_waste` value as the server reads it.
- `checksum`: the content checksum of a model version's directory, which the server reports
  as the version's `model_checksum` parameter.
- `DefaultsOnceFormatter`: the `--help` formatter every `inferd` command uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferd.cli.help_format import DefaultsOnceFormatter
from inferd.dataplane.access import TOKEN_ENV as ADMIN_TOKEN_ENV
from inferd.repository.checksum import checksum

if TYPE_CHECKING:
    from inferd.config.model_config import (
        ConfigError,
        backend_name,
        group_waste,
        instance_count,
        int_parameter,
        read_config,
    )

__all__ = [
    "ADMIN_TOKEN_ENV",
    "ConfigError",
    "DefaultsOnceFormatter",
    "backend_name",
    "checksum",
    "group_waste",
    "instance_count",
    "int_parameter",
    "read_config",
]

# Reading config.pbtxt loads protobuf and tritonclient's gRPC package (about 150 ms): every
# `inferd` command imports this module to build its parser, and most never read a config, so
# these names load on first use (PEP 562).
_CONFIG_NAMES = frozenset(
    {"ConfigError", "backend_name", "group_waste", "instance_count", "int_parameter", "read_config"}
)


def __getattr__(name: str) -> object:
    if name in _CONFIG_NAMES:
        from inferd.config import model_config as config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
