"""How the processes of one multi-worker server see each other's numbers.

With `--workers N` every worker is a whole inferd (its own models, batchers and counters)
sharing the HTTP and gRPC ports through SO_REUSEPORT, so a client's statistics call lands
on one worker at random. Each worker therefore answers its siblings on a unix socket in a
private directory: the worker that took a statistics call sums its siblings' answers with
its own (perf_analyzer and `inferd bench` read deltas of those numbers), and the supervisor
collects every worker's metrics for its one /metrics endpoint, each sample labelled with
its `worker`.

The wire is one JSON line each way; what travels is already-rendered statistics and metric
samples, never objects (no pickle).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.metrics_core import Metric

from inferd.errors import InferdError

log = logging.getLogger("inferd.workers")
ASK_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Which worker this process is, of how many, and where their sockets live."""

    index: int
    count: int
    directory: Path  # private (0700): only this user's processes can ask

    def socket_path(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"

    def siblings(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]


# -- asking ----------------------------------------------------------------------------------


async def ask(path: Path, question: dict[str, Any]) -> dict[str, Any] | None:
    """One sibling's answer, or None when it cannot answer now (restarting, stuck)."""
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            # An answer is one line of any length (many models' statistics, all metrics):
            # the stream reads to the end instead of stopping at its 64 KiB line limit.
            reader, writer = await asyncio.open_unix_connection(str(path))
            try:
                writer.write(orjson.dumps(question) + b"\n")
                line = await reader.read()
            finally:
                writer.close()
        answer = orjson.loads(line)
    except (OSError, TimeoutError, ValueError) as exc:  # JSONDecodeError is a ValueError
        log.warning("worker at %s did not answer %s: %s", path.name, question["op"], exc)
        return None
    return answer if isinstance(answer, dict) else None


def ask_blocking(path: Path, question: dict[str, Any]) -> dict[str, Any] | None:
    """`ask` for a thread without a loop (the supervisor's metrics endpoint)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(ASK_TIMEOUT_S)
            sock.connect(str(path))
            sock.sendall(orjson.dumps(question) + b"\n")
            with sock.makefile("rb") as stream:
                line = stream.read()  # the worker closes after its one line
        answer = orjson.loads(line)
    except (OSError, ValueError) as exc:
        log.warning("worker at %s did not answer %s: %s", path.name, question["op"], exc)
        return None
    return answer if isinstance(answer, dict) else None


# -- statistics ------------------------------------------------------------------------------


def _add_durations(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Add `other`'s {"count", "ns"} values into `into`'s (other keys are not durations)."""
    for key, duration in other.items():
        if not isinstance(duration, dict):
            continue
        slot = into.setdefault(key, {"count": 0, "ns": 0})
        slot["count"] += duration["count"]
        slot["ns"] += duration["ns"]


def merge_model_stats(answers: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Triton `model_stats` lists from several workers as one: counts and durations add
    up, batch statistics per batch size and response statistics per position in the stream,
    `last_inference` is the latest."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for entries in answers:
        for entry in entries:
            key = (entry["name"], entry["version"])
            into = merged.get(key)
            if into is None:
                merged[key] = copy.deepcopy(entry)  # added into: the answers stay as they were
                continue
            into["last_inference"] = max(into["last_inference"], entry["last_inference"])
            into["inference_count"] += entry["inference_count"]
            into["execution_count"] += entry["execution_count"]
            _add_durations(into["inference_stats"], entry["inference_stats"])
            sizes = {b["batch_size"]: b for b in into["batch_stats"]}
            for batch in entry["batch_stats"]:
                if batch["batch_size"] in sizes:
                    _add_durations(sizes[batch["batch_size"]], batch)
                else:
                    sizes[batch["batch_size"]] = copy.deepcopy(batch)
            into["batch_stats"] = [sizes[s] for s in sorted(sizes)]
            responses = into.setdefault("response_stats", {})
            for position, stats in entry.get("response_stats", {}).items():
                if position in responses:
                    _add_durations(responses[position], stats)
                else:
                    responses[position] = copy.deepcopy(stats)
            into["response_stats"] = dict(sorted(responses.items(), key=lambda kv: int(kv[0])))
            if "coalesced" in entry:  # inferd's own, for versions with the response cache
                _add_durations(into, {"coalesced": entry["coalesced"]})
            if "padding" in entry:  # inferd's own, for models with pad_inputs: counts add up
                mine = into.setdefault("padding", dict.fromkeys(entry["padding"], 0))
                for key, count in entry["padding"].items():
                    mine[key] = mine.get(key, 0) + count
            if "degradation" in entry:  # each worker degrades on its own: the worst, and sums
                _merge_degradation(into.setdefault("degradation", {}), entry["degradation"])
    return list(merged.values())


def _merge_degradation(into: dict[str, Any], other: dict[str, Any]) -> None:
    into["tier"] = max(into.get("tier", 0), other["tier"])
    into["p99_ms"] = max(into.get("p99_ms", 0.0), other["p99_ms"])
    into["tier_changes"] = into.get("tier_changes", 0) + other["tier_changes"]
    into["dwell_s"] = max(into.get("dwell_s", 0.0), other.get("dwell_s", 0.0))
    into["trial"] = bool(into.get("trial")) or bool(other.get("trial"))
    requests = into.setdefault("requests", {})
    for tier, actions in other["requests"].items():
        mine = requests.setdefault(tier, {})
        for action, count in actions.items():
            mine[action] = mine.get(action, 0) + count


# -- answering -------------------------------------------------------------------------------

StatsSource = Callable[[str, str], list[dict[str, Any]]]  # (model, version) -> model_stats
MetricsSource = Callable[[], Iterable[Metric]]


class PeerServer:
    """A worker's unix socket: its own statistics and metrics, for its siblings."""

    def __init__(self, slot: WorkerSlot, stats: StatsSource, metrics: MetricsSource | None):
        self.slot = slot
        self.stats = stats
        self.metrics = metrics
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = self.slot.socket_path(self.slot.index)
        path.unlink(missing_ok=True)  # left by this slot's previous process, if it crashed
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            question = orjson.loads(await reader.readline())
            writer.write(orjson.dumps(self.answer(question)) + b"\n")
            await writer.drain()
        except (OSError, orjson.JSONDecodeError) as exc:
            log.debug("sibling question failed: %s", exc)
        finally:
            writer.close()

    def answer(self, question: Any) -> dict[str, Any]:
        op = question.get("op") if isinstance(question, dict) else None
        if op == "stats":
            try:
                return {"stats": self.stats(str(question["model"]), str(question["version"]))}
            except InferdError as exc:
                return {"error": exc.message}
        if op == "metrics" and self.metrics is not None:
            return {"families": families_to_json(self.metrics())}
        return {"error": f"unknown question {op!r}"}


# -- metrics ---------------------------------------------------------------------------------


def families_to_json(families: Iterable[Metric]) -> list[dict[str, Any]]:
    return [
        {
            "name": f.name,
            "documentation": f.documentation,
            "type": f.type,
            "unit": f.unit,
            # JSON has no NaN or infinities: those travel as strings float() reads back.
            "samples": [
                [s.name, s.labels, s.value if math.isfinite(s.value) else str(s.value)]
                for s in f.samples
            ],
        }
        for f in families
    ]


def merge_families(per_worker: dict[int, list[dict[str, Any]]]) -> list[Metric]:
    """Every worker's families as one set, each sample labelled with its `worker`."""
    merged: dict[str, Metric] = {}
    for index, families in sorted(per_worker.items()):
        for f in families:
            family = merged.get(f["name"])
            if family is None:
                family = Metric(f["name"], f["documentation"], f["type"], f["unit"])
                merged[f["name"]] = family
            for name, labels, value in f["samples"]:
                family.add_sample(name, {**labels, "worker": str(index)}, float(value))
    return list(merged.values())
