"""Triton's `TritonPythonModel.auto_complete_config(auto_complete_model_config)`.

Called once per load, before the config is validated, with a `pb_utils.ModelConfig` holding
the config as read (from config.pbtxt, or just the name and backend when the folder has
none); the `ModelConfig` it returns is the config inferd validates and serves. It may set
`max_batch_size`, `input`, `output`, `dynamic_batching` and `model_transaction_policy`.
As in Triton, it runs on a fresh import of model.py, whose objects are thrown away: in the
server process, or, with `isolation: "process"`, in a worker process of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.backends.python import pb_utils
from inferd.backends.python.model_import import MODEL_FILE, import_model_module
from inferd.backends.python.model_prints import running_model
from inferd.config.model_config import ConfigError, check_honoured, to_json


def completed_config(model_name: str, version_dir: Path, config: mc.ModelConfig) -> str | None:
    """The config `auto_complete_config` returns, as Triton's JSON; None when model.py has
    no `TritonPythonModel.auto_complete_config` (or is an inferd `Model`)."""
    where = f"{model_name}/{version_dir.name}/{MODEL_FILE}"
    try:
        module = import_model_module(model_name, version_dir)
    except Exception as exc:
        raise ConfigError(f"{where}: {import_failed(version_dir, exc)}") from None
    try:
        model_class = getattr(module, "TritonPythonModel", None)
        if hasattr(module, "Model") or not hasattr(model_class, "auto_complete_config"):
            return None
        given = pb_utils.ModelConfig(json.dumps(to_json(config)))
        try:
            with running_model(model_name):
                result = model_class.auto_complete_config(given)  # type: ignore[union-attr]
        except Exception as exc:
            raise ConfigError(f"{where}: auto_complete_config: {exc}") from None
        if not isinstance(result, pb_utils.ModelConfig):
            raise ConfigError(
                f"{where}: auto_complete_config must return a pb_utils.ModelConfig, got "
                f"{type(result).__name__}"
            )
        return json.dumps(result.as_dict())
    finally:
        sys.modules.pop(module.__name__, None)


def import_failed(version_dir: Path, exc: BaseException) -> str:
    """What importing model.py (to look for its `auto_complete_config`, as Triton does
    before a load) failed on, and, for a package it lacks, where packages come from."""
    try:
        names_it = "auto_complete_config" in (version_dir / MODEL_FILE).read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        names_it = False
    why = (
        "importing it to run its auto_complete_config failed"
        if names_it
        else "importing it failed (it is imported before the load to find out whether its "
        "TritonPythonModel defines auto_complete_config)"
    )
    message = f"{why}: {type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError):
        message += (
            " (a model's packages must be in the environment it runs in: the server's, or "
            "one of its own named by parameters.EXECUTION_ENV_PATH, docs/python-models.md)"
        )
    return message


def apply_completion(config: mc.ModelConfig, completed: str, version: str) -> None:
    """Replace `config` with what auto_complete_config returned, and check it is honoured
    (a decoupled transaction policy it set fails the load as one in config.pbtxt would)."""
    where = (
        f"{config.name}/config.pbtxt as completed by {version}/{MODEL_FILE} auto_complete_config"
    )
    result = mc.ModelConfig()
    try:
        json_format.Parse(completed, result)
    except json_format.ParseError as exc:
        raise ConfigError(f"{where}: not a valid model config: {exc}") from None
    if result.name != config.name:
        raise ConfigError(f"{where}: name: changed from '{config.name}' to '{result.name}'")
    check_honoured(result, where)
    config.CopyFrom(result)
