"""The candidates of a sweep: the grid of settings, which axes a model's backend honours, and
each candidate's config (the original with the candidate's settings applied)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from inferd.public import backend_name
from inferd_tools.tune.errors import TuneError

T = TypeVar("T")

# `optimization { graph { level } }` as the ONNX Runtime backend reads it.
GRAPH_LEVELS = {-1: "basic", 0: "all", 1: "extended", 2: "none"}

INTRA_OP_KEY = "intra_op_thread_count"
PAD_WASTE_KEY = "pad_grouping_waste"
PAD_WINDOW_KEY = "pad_grouping_window"


@dataclass(frozen=True)
class Candidate:
    max_batch_size: int
    delay_us: int
    instances: int
    preferred: bool
    # The axes a sweep may leave out: None keeps the original config's setting.
    intra_op_threads: int | None = None
    graph_level: int | None = None
    pad_waste: str | None = None  # a number (the share of real elements) or "off"
    pad_window: int | None = None

    def label(self) -> str:
        text = (
            f"max_batch_size={self.max_batch_size} delay_us={self.delay_us} "
            f"instances={self.instances} preferred={'on' if self.preferred else 'off'}"
        )
        for name, value in self.varied():
            text += f" {name}={value}"
        return text

    def varied(self) -> list[tuple[str, str]]:
        """The optional axes this candidate sets, as (config name, value)."""
        pairs = [
            (INTRA_OP_KEY, self.intra_op_threads),
            ("graph_level", self.graph_level),
            (PAD_WASTE_KEY, self.pad_waste),
            (PAD_WINDOW_KEY, self.pad_window),
        ]
        return [(name, str(value)) for name, value in pairs if value is not None]

    def branch(self) -> tuple[object, ...]:
        """Everything but max_batch_size: a failure skips bigger batches of the same branch."""
        return (
            self.delay_us,
            self.instances,
            self.preferred,
            self.intra_op_threads,
            self.graph_level,
            self.pad_waste,
            self.pad_window,
        )


@dataclass
class Axes:
    """The values each setting takes; None for an optional axis the sweep leaves alone."""

    max_batch_sizes: list[int]
    delays_us: list[int]
    instances: list[int]
    preferred: list[bool]
    intra_op_threads: list[int] | None = None
    graph_levels: list[int] | None = None
    pad_wastes: list[str] | None = None
    pad_windows: list[int] | None = None


def grid(axes: Axes) -> list[Candidate]:
    """Every combination; max_batch_size varies fastest and ascending, so a failure can skip
    the bigger sizes of its branch."""
    combos = itertools.product(
        axes.preferred,
        axes.instances,
        axes.delays_us,
        _optional(axes.intra_op_threads),
        _optional(axes.graph_levels),
        _optional(axes.pad_wastes),
        _optional(axes.pad_windows),
        sorted(axes.max_batch_sizes),
    )
    return [
        Candidate(m, d, n, p, threads, level, waste, window)
        for p, n, d, threads, level, waste, window, m in combos
    ]


def _optional(values: Sequence[T] | None) -> list[T | None]:
    """An optional axis's values, or the one value None (the original's setting)."""
    return [None] if values is None else [*values]


def _parameter(config: dict[str, Any], key: str) -> str:
    value = (config.get("parameters") or {}).get(key) or {}
    return str(value.get("string_value", "")) if isinstance(value, dict) else ""


def check_axes(original: dict[str, Any], axes: Axes, model: str) -> None:
    """Refuse an axis the model would not honour, before anything is loaded: the ONNX Runtime
    settings on another backend, the length grouping on a model that does not pad."""
    message = mc.ModelConfig()
    json_format.ParseDict(original, message, ignore_unknown_fields=True)
    backend = backend_name(message) or message.platform or "unknown"
    for option, swept in (
        ("--intra-op-threads", axes.intra_op_threads is not None),
        ("--graph-levels", axes.graph_levels is not None),
    ):
        if swept and backend != "onnxruntime":
            raise TuneError(
                f"{option} sets an ONNX Runtime session option, and model {model!r} runs on "
                f"the {backend!r} backend; leave {option} out for it"
            )
    for option, key, swept in (
        ("--pad-grouping-waste", PAD_WASTE_KEY, axes.pad_wastes is not None),
        ("--pad-grouping-window", PAD_WINDOW_KEY, axes.pad_windows is not None),
    ):
        if swept and not _parameter(original, "pad_inputs").strip():
            raise TuneError(
                f"{option} sets the length grouping ({key}) of a model that pads its inputs, "
                f"and model {model!r} has no pad_inputs parameter; leave {option} out for it"
            )


def candidate_config(original: dict[str, Any], c: Candidate) -> dict[str, Any]:
    """The original config with the candidate's settings applied."""
    doc = copy.deepcopy(original)
    doc["max_batch_size"] = c.max_batch_size
    batching = dict(doc.get("dynamic_batching") or {})
    batching["max_queue_delay_microseconds"] = c.delay_us
    batching["preferred_batch_size"] = [c.max_batch_size] if c.preferred else []
    doc["dynamic_batching"] = batching
    groups = doc.get("instance_group") or [{}]
    first = dict(groups[0])
    first["count"] = c.instances
    doc["instance_group"] = [first]
    parameters = dict(doc.get("parameters") or {})
    for key, value in (
        (INTRA_OP_KEY, c.intra_op_threads),
        (PAD_WASTE_KEY, c.pad_waste),
        (PAD_WINDOW_KEY, c.pad_window),
    ):
        if value is not None:
            parameters[key] = {"string_value": str(value)}
    doc["parameters"] = parameters
    if c.graph_level is not None:
        optimization = dict(doc.get("optimization") or {})
        graph = dict(optimization.get("graph") or {})
        graph["level"] = c.graph_level
        optimization["graph"] = graph
        doc["optimization"] = optimization
    return doc
