"""Triton's trace file mode (`--trace-config triton,file=PATH`) on a real server, over HTTP
and gRPC from one case table: the settings changed with tritonclient's
`update_trace_settings` (globally and per model), requests sent, the server stopped, and
the files read back: which traces each holds (rate, count, log frequency, a model's own
settings), and each trace's content (ids, model, version, Triton's timestamps in order)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inferd.telemetry.trace_config import parse_trace_config
from inferd.telemetry.trace_file import NAMES
from tests.support.ensemble_models import write_ensemble_models
from tests.support.metrics_scrape import scrape
from tests.support.models import write_counter
from tests.support.protocol_clients import PROTOCOLS
from tests.support.servers import RunningServer, run_server
from tests.support.trace_clients import TraceClient


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace_file_repo")
    write_counter(path, "counter")
    write_counter(path, "other")
    return path


@contextmanager
def traced_server(
    repo: Path, directory: Path, flags: list[str], protocol: str
) -> Iterator[tuple[RunningServer, TraceClient]]:
    config = parse_trace_config([f"triton,file={directory / 'trace.json'}", *flags])
    with run_server(repo, admin_api=True, trace=config) as server:
        client = TraceClient(protocol, server)
        try:
            yield server, client
        finally:
            client.close()


def files(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """Each trace file the server wrote, parsed (a whole JSON array each: it has stopped)."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("trace.json*"))}


def check_traces(written: dict[str, list[dict[str, Any]]]) -> None:
    """What every trace of a plain model holds, whichever file it is in."""
    ids = sorted(t["id"] for traces in written.values() for t in traces)
    assert ids == list(range(1, len(ids) + 1))  # numbered from 1, none twice
    for traces in written.values():
        for t in traces:
            assert set(t) == {"id", "model_name", "model_version", "request_id", "timestamps"}
            assert t["model_version"] == 1 and t["request_id"] == "req"
            names = [s["name"] for s in t["timestamps"]]
            assert names == list(NAMES)
            ns = [s["ns"] for s in t["timestamps"]]
            assert ns == sorted(ns) and ns[0] < ns[-1], t


# (id, flags at start beside the file, changes [(model or "", settings)], requests
#  [(model, n)], the files written with the model of each trace, settings read at the end
#  [(model or "", setting, value)])
CASES: list[tuple[str, list[str], list[Any], list[Any], dict[str, list[str]], list[Any]]] = [
    (
        "every request",
        ["level=TIMESTAMPS", "rate=1"],
        [],
        [("counter", 3)],
        {"trace.json": ["counter"] * 3},
        [("", "trace_rate", "1"), ("", "log_frequency", "0")],
    ),
    (
        "tritons default rate: the first of 1000",
        ["level=TIMESTAMPS"],
        [],
        [("counter", 3)],
        {"trace.json": ["counter"]},
        [("", "trace_rate", "1000")],
    ),
    (
        "off at start, on through the API",
        [],
        [("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})],
        [("counter", 2)],
        {"trace.json": ["counter"] * 2},
        [("", "trace_level", ["TIMESTAMPS"])],
    ),
    (
        "rate: one in 3, one counter for every model",
        ["level=TIMESTAMPS", "rate=1"],
        [("", {"trace_rate": "3"})],
        [("counter", 4), ("other", 3)],  # the 1st, 4th and 7th
        {"trace.json": ["counter", "counter", "other"]},
        [("", "trace_rate", "3"), ("other", "trace_rate", "3")],
    ),
    (
        "count: the last one writes its file",
        ["level=TIMESTAMPS", "rate=1"],
        [("", {"trace_count": "2"})],
        [("counter", 5)],
        {"trace.json.0": ["counter"] * 2},
        [("", "trace_count", "0")],
    ),
    (
        "log frequency: a file every 2 traces",
        ["level=TIMESTAMPS", "rate=1"],
        [("", {"log_frequency": "2"})],
        [("counter", 5)],
        {
            "trace.json.0": ["counter"] * 2,
            "trace.json.1": ["counter"] * 2,
            "trace.json.2": ["counter"],
        },
        [("", "log_frequency", "2")],
    ),
    (
        "a model's own level and log frequency",
        ["level=TIMESTAMPS", "rate=1"],
        [("counter", {"trace_level": ["OFF"]}), ("other", {"log_frequency": "1"})],
        [("counter", 2), ("other", 2)],
        {"trace.json.0": ["other"], "trace.json.1": ["other"]},
        [
            ("counter", "trace_level", ["OFF"]),
            ("other", "log_frequency", "1"),
            ("", "trace_level", ["TIMESTAMPS"]),
            ("", "log_frequency", "0"),
        ],
    ),
    (
        "a model's own rate counts its requests alone",
        ["level=TIMESTAMPS", "rate=1"],
        [("counter", {"trace_rate": "2"})],
        [("counter", 4), ("other", 1)],
        {"trace.json": ["counter", "counter", "other"]},
        [("counter", "trace_rate", "2"), ("other", "trace_rate", "1")],
    ),
    (
        "a model's values dropped with null",
        ["level=TIMESTAMPS", "rate=1"],
        [("counter", {"trace_level": ["OFF"]}), ("counter", {"trace_level": None})],
        [("counter", 1)],
        {"trace.json": ["counter"]},
        [("counter", "trace_level", ["TIMESTAMPS"])],
    ),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("flags", "changes", "requests", "expected", "settings"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_settings_decide_what_each_file_holds(
    repo: Path,
    tmp_path: Path,
    protocol: str,
    flags: list[str],
    changes: list[Any],
    requests: list[Any],
    expected: dict[str, list[str]],
    settings: list[Any],
) -> None:
    with traced_server(repo, tmp_path, flags, protocol) as (_, client):
        for model, change in changes:
            answer = client.update(change, model or None)
            for key, value in change.items():
                if value is not None:
                    assert answer[key] == value
        for model, n in requests:
            client.infer(model, n, request_id="req")
        for model, key, value in settings:
            assert client.get(model or None)[key] == value, (model, key)
    written = files(tmp_path)
    assert {name: [t["model_name"] for t in traces] for name, traces in written.items()} == expected
    check_traces(written)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_settings_read_as_tritons_and_drops_are_counted(
    repo: Path, tmp_path: Path, protocol: str
) -> None:
    flags = ["level=TIMESTAMPS", "rate=10", "count=7", "triton,log-frequency=3"]
    with traced_server(repo, tmp_path, flags, protocol) as (server, client):
        assert client.get() == {
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "10",
            "trace_count": "7",
            "log_frequency": "3",
            "trace_file": str(tmp_path / "trace.json"),
            "trace_mode": "triton",
        }
        assert client.get("counter") == client.get()
        samples = scrape(server)
        for reason in ("queue_full", "write_error"):
            assert samples[("inferd_trace_dropped_total", frozenset({("reason", reason)}))] == 0


# (id, settings, words in the message)
REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    ("a trace file", {"trace_file": "/etc/cron.d/x"}, ["'trace_file'", "set at start only"]),
    ("another mode", {"trace_mode": "opentelemetry"}, ["'trace_mode'", "mode triton"]),
    ("log frequency below 0", {"log_frequency": "-1"}, ["'log_frequency'", "from 0"]),
    ("TENSORS", {"trace_level": ["TENSORS"]}, ["'trace_level'", "TENSORS is not supported"]),
    # All or nothing: the valid rate beside a refused file is not applied either.
    ("a valid one beside", {"trace_rate": "5", "trace_file": "x"}, ["'trace_file'"]),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_file_and_mode_are_read_only(repo: Path, tmp_path: Path, protocol: str) -> None:
    with traced_server(repo, tmp_path, ["level=TIMESTAMPS", "rate=1"], protocol) as (_, client):
        before = client.get()
        for _, settings, words in REFUSED:
            with pytest.raises(InferenceServerException) as info:
                client.update(settings)
            expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
            assert info.value.status() == expected
            for word in words:
                assert word in info.value.message(), (settings, info.value.message())
        # A null (or the mode it has) asks for what holds already: accepted, nothing changes.
        assert client.update({"trace_file": None, "trace_mode": "triton"}) == before
    assert not Path("/etc/cron.d/x").exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensembles_steps_name_it_as_their_parent(tmp_path: Path, protocol: str) -> None:
    write_ensemble_models(tmp_path)
    config = parse_trace_config(
        [f"triton,file={tmp_path / 'trace.json'}", "level=TIMESTAMPS", "rate=1"]
    )
    with run_server(tmp_path / "models", trace=config) as server:
        client = TraceClient(protocol, server)
        try:
            for _ in range(2):
                inp = client.mod.InferInput("IN", [1, 1], "FP32")
                inp.set_data_from_numpy(np.full((1, 1), 2.0, np.float32))
                client.raw.infer("chain", [inp])
        finally:
            client.close()
    [traces] = files(tmp_path).values()
    rows = [(t["id"], t.get("parent_id"), t["model_name"]) for t in traces]
    assert rows == [
        (1, None, "chain"),
        (2, 1, "double"),
        (3, 1, "add_ten"),
        (4, 1, "square"),
        (5, None, "chain"),
        (6, 5, "double"),
        (7, 5, "add_ten"),
        (8, 5, "square"),
    ]
    chain, *steps = traces[:4]
    start, end = (s["ns"] for s in chain["timestamps"])
    for step in steps:
        ns = [s["ns"] for s in step["timestamps"]]
        assert [s["name"] for s in step["timestamps"]] == list(NAMES)
        assert start <= ns[0] and ns[-1] <= end  # within the ensemble's request
