"""The chosen candidate's config.pbtxt: written, then read back by the server's own config
parser, and checked to hold exactly the candidate's settings before it is kept."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.public import ConfigError, instance_count, read_config
from inferd_tools.tune.candidates import (
    INTRA_OP_KEY,
    PAD_WASTE_KEY,
    PAD_WINDOW_KEY,
    Candidate,
)
from inferd_tools.tune.errors import TuneError


def to_pbtxt(config: dict[str, Any]) -> str:
    """A config (Triton's JSON form) as config.pbtxt text."""
    message = mc.ModelConfig()
    json_format.ParseDict(config, message)
    text: str = text_format.MessageToString(message)
    return text


def held_settings(config: mc.ModelConfig, c: Candidate) -> dict[str, object]:
    """What `config` sets for each of the candidate's settings, in the candidate's terms."""
    params = config.parameters
    batching = config.dynamic_batching
    held: dict[str, object] = {
        "max_batch_size": config.max_batch_size,
        "delay_us": batching.max_queue_delay_microseconds,
        "instances": instance_count(config),
        "preferred": list(batching.preferred_batch_size) == [config.max_batch_size],
    }
    if c.intra_op_threads is not None:
        held["intra_op_threads"] = params[INTRA_OP_KEY].string_value
    if c.graph_level is not None:
        held["graph_level"] = config.optimization.graph.level
    if c.pad_waste is not None:
        held["pad_waste"] = params[PAD_WASTE_KEY].string_value
    if c.pad_window is not None:
        held["pad_window"] = params[PAD_WINDOW_KEY].string_value
    return held


def wanted_settings(c: Candidate) -> dict[str, object]:
    wanted: dict[str, object] = {
        "max_batch_size": c.max_batch_size,
        "delay_us": c.delay_us,
        "instances": c.instances,
        "preferred": c.preferred,
    }
    if c.intra_op_threads is not None:
        wanted["intra_op_threads"] = str(c.intra_op_threads)
    if c.graph_level is not None:
        wanted["graph_level"] = c.graph_level
    if c.pad_waste is not None:
        wanted["pad_waste"] = c.pad_waste
    if c.pad_window is not None:
        wanted["pad_window"] = str(c.pad_window)
    return wanted


def write_checked(path: Path, config: dict[str, Any], c: Candidate) -> None:
    """Write `config` as config.pbtxt text to `path`, once the server's parser has read the
    same text back with the candidate's settings: a file that would not load, or would load
    as something else, is never written."""
    text = to_pbtxt(config)
    name = str(config.get("name") or "model")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / name
        model_dir.mkdir()
        (model_dir / "config.pbtxt").write_text(text, encoding="utf-8")
        try:
            parsed, _ = read_config(model_dir)
        except ConfigError as e:
            raise TuneError(
                f"--write-config {path}: the chosen config does not parse: {e}"
            ) from None
    held, wanted = held_settings(parsed, c), wanted_settings(c)
    if held != wanted:
        raise TuneError(
            f"--write-config {path}: the chosen config reads back as {held}, not {wanted}; "
            "nothing written"
        )
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise TuneError(f"--write-config {path}: {e}") from None
