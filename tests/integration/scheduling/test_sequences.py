"""Sequence batching end to end: real servers, real models, Triton's own clients.

Issue #13: a stateful model must get its control inputs, its correlation id and its own
state, and interleaved sequences must never share state. Every model here answers a step
with the running sum of its own sequence's values (tests/support/sequence_models.py), so a request
routed to the wrong instance, slot or state shows as a wrong number.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.metrics_scrape import scrape, value
from tests.support.sequence_models import (
    build_sequence_repository,
    write_process_accumulator,
    write_process_triton_accumulator,
    write_short_idle,
)
from tests.support.servers import RunningServer, run_server, sequence_batcher_of, wait_for

PROTOCOLS = ["http", "grpc"]
IDLE_US = 200_000  # acc_idle's max_sequence_idle_microseconds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("sequences")
    build_sequence_repository(repo)
    write_short_idle(repo, "acc_idle", IDLE_US)
    write_process_accumulator(repo)
    write_process_triton_accumulator(repo)
    bad = repo / "bad_sequence"
    (bad / "1").mkdir(parents=True)
    (bad / "1" / "model.py").write_text("class Model:\n    pass\n", encoding="utf-8")
    (bad / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 2\n'
        'input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        "sequence_batching { oldest { preserve_ordering: true } }\n",
        encoding="utf-8",
    )
    with run_server(repo) as running:
        yield running


class Client:
    """tritonclient.http or tritonclient.grpc behind one small interface."""

    def __init__(self, protocol: str, server: RunningServer) -> None:
        self.protocol = protocol
        self.mod: Any = httpclient if protocol == "http" else grpcclient
        address = f"127.0.0.1:{server.port}" if protocol == "http" else server.grpc_address
        self.raw = self.mod.InferenceServerClient(address)

    def step(self, model: str, value: float, datatype: str = "FP32", **kwargs: Any) -> Any:
        dtype = np.float32 if datatype == "FP32" else np.int64
        inp = self.mod.InferInput("IN", [1, 1], datatype)
        inp.set_data_from_numpy(np.array([[value]], dtype=dtype))
        return self.raw.infer(model, [inp], **kwargs)

    def close(self) -> None:
        self.raw.close()


def sequence_ids(model: str, count: int) -> list[int | str]:
    if model == "acc_triton":  # a STRING CORRID: string ids
        return [f"seq-{k}" for k in range(count)]
    return [(1 << 40) + 17 * k for k in range(1, count + 1)]  # large, and not consecutive


def run_sequences(
    server: RunningServer,
    protocol: str,
    model: str,
    steps: dict[int | str, list[int]],
    datatype: str = "FP32",
) -> dict[int | str, list[Any]]:
    """Run each sequence in a thread of its own (all at once); each returns its results."""
    results: dict[int | str, list[Any]] = {}
    errors: list[BaseException] = []

    def one(cid: int | str, values: list[int]) -> None:
        client = Client(protocol, server)
        try:
            results[cid] = [
                client.step(
                    model,
                    v,
                    datatype,
                    sequence_id=cid,
                    sequence_start=i == 0,
                    sequence_end=i == len(values) - 1,
                )
                for i, v in enumerate(values)
            ]
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=item) for item in steps.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


def statistics(server: RunningServer, model: str) -> dict[str, Any]:
    doc = httpx.get(f"{server.url}/v2/models/{model}/stats").json()
    stats: dict[str, Any] = doc["model_stats"][0]
    return stats


ACCUMULATORS = ["acc", "acc_triton", "acc_onnx"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ACCUMULATORS)
def test_interleaved_sequences_each_accumulate_only_their_own_values(
    server: RunningServer, protocol: str, model: str
) -> None:
    # acc: inferd's Python API keeping sums by CORRID (oldest, 2 instances x 4 candidates);
    # acc_triton: a TritonPythonModel keeping sums by correlation_id() (direct, 4 slots, so
    # half the sequences wait in the backlog); acc_onnx: ONNX with implicit state (direct,
    # 2 instances x 4 slots).
    rng = np.random.default_rng([PROTOCOLS.index(protocol), ACCUMULATORS.index(model)])
    ids = sequence_ids(model, 8)
    steps = {cid: rng.integers(1, 100, size=int(rng.integers(1, 12))).tolist() for cid in ids}
    batcher = sequence_batcher_of(server, model)
    before = statistics(server, model)
    ended_before = batcher.released().get("end", 0)

    results = run_sequences(server, protocol, model, steps)

    for cid, values in steps.items():
        got = [float(r.as_numpy("OUT").ravel()[0]) for r in results[cid]]
        assert got == np.cumsum(values).astype(float).tolist(), f"sequence {cid}"
    after = statistics(server, model)
    total = sum(len(v) for v in steps.values())
    assert after["inference_count"] - before["inference_count"] == total
    executions = after["execution_count"] - before["execution_count"]
    assert 0 < executions <= total
    assert batcher.released()["end"] - ended_before == 8
    assert batcher.active_sequences() == 0 and batcher.backlog() == 0


def test_a_process_isolated_model_gets_each_requests_sequence(server: RunningServer) -> None:
    # predict(inputs, requests) in a worker process: the infos cross the pipe with the batch.
    steps: dict[int | str, list[int]] = {cid: [cid, 1, 2] for cid in (71, 72, 73)}
    results = run_sequences(server, "grpc", "acc_process", steps)
    for cid, values in steps.items():
        got = [float(r.as_numpy("OUT").ravel()[0]) for r in results[cid]]
        assert got == np.cumsum(values).astype(float).tolist()


def test_a_process_isolated_triton_model_gets_each_requests_sequence(
    server: RunningServer,
) -> None:
    # correlation_id() and flags() of a TritonPythonModel in a worker process: they cross the
    # pipe with each request of the batch (string ids, the direct strategy).
    steps: dict[int | str, list[int]] = {f"p-{k}": [k, 1, 2] for k in (1, 2, 3)}
    results = run_sequences(server, "grpc", "acc_triton_process", steps)
    for cid, values in steps.items():
        got = [float(r.as_numpy("OUT").ravel()[0]) for r in results[cid]]
        assert got == np.cumsum(values).astype(float).tolist()


def test_a_sequence_keeps_its_instance_and_batch_slot(server: RunningServer) -> None:
    # Direct strategy, 2 instances x 4 slots: once all 8 sequences have started, each holds
    # its own (instance, slot) pair to its end; the slot is the batch row the model sees.
    clients = [Client("grpc", server) for _ in range(8)]
    ids = list(range(501, 509))
    rng = np.random.default_rng(3)
    values = {cid: rng.integers(1, 50, size=6).tolist() for cid in ids}
    seen: dict[int, set[tuple[int, int]]] = {cid: set() for cid in ids}
    sums: dict[int, list[int]] = {cid: [] for cid in ids}

    def step(client: Client, cid: int, i: int) -> None:
        r = client.step(
            "slots", values[cid][i], "INT64", sequence_id=cid, sequence_start=i == 0,
            sequence_end=i == 5,
        )  # fmt: skip
        assert int(r.as_numpy("READY").ravel()[0]) == 1  # its own row is always ready
        seen[cid].add((int(r.as_numpy("INSTANCE").ravel()[0]), int(r.as_numpy("ROW").ravel()[0])))
        sums[cid].append(int(r.as_numpy("OUT").ravel()[0]))

    try:
        for client, cid in zip(clients, ids, strict=True):
            step(client, cid, 0)  # all 8 live at once
        threads = [
            threading.Thread(target=lambda c=c, s=s: [step(c, s, i) for i in range(1, 6)])  # type: ignore[func-returns-value]
            for c, s in zip(clients, ids, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for client in clients:
            client.close()
    assert all(len(places) == 1 for places in seen.values()), seen
    places = {next(iter(p)) for p in seen.values()}
    assert places == {(inst, row) for inst in (0, 1) for row in range(4)}
    for cid in ids:
        assert sums[cid] == np.cumsum(values[cid]).tolist()  # implicit state, per sequence


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_that_does_not_batch_keeps_each_sequences_state(
    server: RunningServer, protocol: str
) -> None:
    # max_batch_size 0: one slot, so two of the three sequences wait in the backlog.
    def one(cid: int, base: float) -> list[list[float]]:
        client = Client(protocol, server)
        try:
            got = []
            for i in range(4):
                inp = client.mod.InferInput("IN", [2], "FP32")
                inp.set_data_from_numpy(np.array([base, 1.0], dtype=np.float32))
                r = client.raw.infer(
                    "acc_unbatched", [inp], sequence_id=cid, sequence_start=i == 0,
                    sequence_end=i == 3,
                )  # fmt: skip
                got.append(r.as_numpy("OUT").tolist())
            return got
        finally:
            client.close()

    results: dict[int, list[list[float]]] = {}
    threads = [
        threading.Thread(target=lambda c=c: results.__setitem__(c, one(c, float(c))))
        for c in (2**62, 3, 4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for cid in (2**62, 3, 4):
        assert results[cid] == [[cid * k, float(k)] for k in (1, 2, 3, 4)], cid


def test_a_grpc_stream_keeps_each_sequences_order(server: RunningServer) -> None:
    # Every step of three interleaved sequences is sent before any answer comes back.
    client = grpcclient.InferenceServerClient(server.grpc_address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    values = {901: [1, 2, 3, 4, 5], 902: [10, 20, 30], 903: [7, 7, 7, 7]}
    sent = 0
    try:
        for i in range(5):
            for cid, vals in values.items():
                if i >= len(vals):
                    continue
                inp = grpcclient.InferInput("IN", [1, 1], "FP32")
                inp.set_data_from_numpy(np.array([[vals[i]]], dtype=np.float32))
                client.async_stream_infer(
                    "acc_onnx", [inp], request_id=f"{cid}-{i}", sequence_id=cid,
                    sequence_start=i == 0, sequence_end=i == len(vals) - 1,
                )  # fmt: skip
                sent += 1
        got: dict[str, float] = {}
        for _ in range(sent):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = float(result.as_numpy("OUT").ravel()[0])
    finally:
        client.stop_stream()
        client.close()
    for cid, vals in values.items():
        sums = [got[f"{cid}-{i}"] for i in range(len(vals))]
        assert sums == np.cumsum(vals).astype(float).tolist()


# -- refusals, over both protocols --------------------------------------------------------

F32_2 = np.ones((2, 1), dtype=np.float32)

# (id, model, sequence kwargs, extra inputs, words in the 400 message)
REFUSALS: list[tuple[str, str, dict[str, Any], dict[str, Any], list[str]]] = [
    (
        "no sequence id",
        "acc",
        {},
        {},
        ["model 'acc'", "non-zero or non-empty correlation ID", "sequence_id"],
    ),
    (
        "no START seen",
        "acc",
        {"sequence_id": 4242},
        {},
        ["sequence 4242 to model 'acc' must specify the START flag"],
    ),
    (
        "a control input from the client",
        "acc",
        {"sequence_id": 4243, "sequence_start": True},
        {"START": (np.ones((1, 1), dtype=np.int32), "INT32")},
        ["input 'START' is the sequence control input CONTROL_SEQUENCE_START", "must not"],
    ),
    (
        "a state input from the client",
        "acc_onnx",
        {"sequence_id": 4244, "sequence_start": True},
        {"STATE_IN": (np.ones((1, 1), dtype=np.float32), "FP32")},
        ["input 'STATE_IN' is an implicit state input of model 'acc_onnx'"],
    ),
    (
        "a sequence id for a model without sequence batching",
        "plain",
        {"sequence_id": 7, "sequence_start": True},
        {},
        ["request parameter 'sequence_id'", "model 'plain' is not a sequence model"],
    ),
    (
        "a string id for an integer CORRID",
        "acc",
        {"sequence_id": "abc", "sequence_start": True},
        {},
        ["'sequence_id'", "integer sequence ids", "CORRID", "'abc'"],
    ),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("model", "kwargs", "extra", "words"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_a_request_outside_a_live_sequence_is_refused_naming_why(
    server: RunningServer,
    protocol: str,
    model: str,
    kwargs: dict[str, Any],
    extra: dict[str, Any],
    words: list[str],
) -> None:
    client = Client(protocol, server)
    try:
        inputs = []
        for name, (array, datatype) in {
            "IN": (np.ones((1, 1), dtype=np.float32), "FP32"),
            **extra,
        }.items():
            inp = client.mod.InferInput(name, list(array.shape), datatype)
            inp.set_data_from_numpy(array)
            inputs.append(inp)
        with pytest.raises(InferenceServerException) as info:
            client.raw.infer(model, inputs, **kwargs)
        expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
        assert info.value.status() == expected, info.value.message()
        for word in words:
            assert word in info.value.message()
        # The server keeps serving, and a proper sequence still works.
        r = client.step("acc", 5, sequence_id=31337, sequence_start=True, sequence_end=True)
        assert float(r.as_numpy("OUT").ravel()[0]) == 5.0
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ended_sequence_takes_no_more_requests(server: RunningServer, protocol: str) -> None:
    client = Client(protocol, server)
    cid = 777 if protocol == "http" else 778
    try:
        client.step("acc", 1, sequence_id=cid, sequence_start=True)
        client.step("acc", 2, sequence_id=cid, sequence_end=True)
        with pytest.raises(InferenceServerException) as info:
            client.step("acc", 3, sequence_id=cid)
        assert f"sequence {cid} to model 'acc' must specify the START flag" in str(info.value)
        assert f"(sequence {cid} already ended)" in str(info.value)
        with pytest.raises(InferenceServerException, match="batch-size 1"):
            batch = client.mod.InferInput("IN", [2, 1], "FP32")
            batch.set_data_from_numpy(F32_2)
            client.raw.infer("acc", [batch], sequence_id=cid, sequence_start=True)
        # The same id starts a new sequence, from a clean sum.
        r = client.step("acc", 10, sequence_id=cid, sequence_start=True)
        assert float(r.as_numpy("OUT").ravel()[0]) == 10.0  # left open: the server's stop
    finally:  # releases it (teardown must not wait for it)
        client.close()


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"sequence_id": True, "sequence_start": True}, ["'sequence_id'", "True"]),
        ({"sequence_id": -1, "sequence_start": True}, ["'sequence_id'", "unsigned 64-bit", "-1"]),
        ({"sequence_id": 2**64, "sequence_start": True}, ["'sequence_id'"]),
        ({"sequence_id": 1.5}, ["'sequence_id'", "1.5"]),
        ({"sequence_id": 3, "sequence_start": "yes"}, ["'sequence_start' must be a boolean"]),
        ({"sequence_id": 3, "sequence_end": 1}, ["'sequence_end' must be a boolean"]),
        (
            {"sequence_id": 2**63, "sequence_start": True, "model": "acc_unbatched"},
            ["'sequence_id'", "up to 9223372036854775807", "INT64"],
        ),
    ],
)
def test_malformed_sequence_parameters_are_refused(
    server: RunningServer, parameters: dict[str, Any], words: list[str]
) -> None:
    parameters = dict(parameters)
    model = parameters.pop("model", "acc")
    tensor = {"shape": [1, 1], "data": [1]} if model == "acc" else {"shape": [2], "data": [1, 1]}
    body = {
        "inputs": [{"name": "IN", "datatype": "FP32", **tensor}],
        "parameters": parameters,
    }
    r = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    assert r.status_code == 400, r.text
    for word in words:
        assert word in r.json()["error"]


# -- idle release, metrics, load errors ---------------------------------------------------


def test_an_idle_sequence_is_released_and_counted(server: RunningServer) -> None:
    batcher = sequence_batcher_of(server, "acc_idle")
    client = Client("http", server)
    try:
        client.step("acc_idle", 1, sequence_id=55, sequence_start=True)
        assert batcher.active_sequences() == 1
        samples = scrape(server)
        labels = {"model": "acc_idle", "version": "1"}
        assert value(samples, "inferd_sequences_active", **labels) == 1.0
        # The reaper is a timer: the sequence goes once it has been idle for 0.2 s.
        wait_for(batcher, lambda b: b.active_sequences() == 0, "the idle sequence released")
        with pytest.raises(InferenceServerException) as info:
            client.step("acc_idle", 2, sequence_id=55)
        assert info.value.status() == "400"
        assert "sequence 55 to model 'acc_idle'" in info.value.message()
        assert "released after 0.2 s without requests" in info.value.message()
        samples = scrape(server)
        assert value(samples, "inferd_sequences_active", **labels) == 0.0
        released = value(samples, "inferd_sequences_released_total", reason="idle", **labels)
        assert released == 1.0
    finally:
        client.close()


def test_sequence_metrics_count_ended_sequences(server: RunningServer) -> None:
    client = Client("http", server)
    labels = {"model": "acc", "version": "1"}
    before = value(scrape(server), "inferd_sequences_released_total", reason="end", **labels)
    try:
        for cid in (61, 62):
            client.step("acc", 1, sequence_id=cid, sequence_start=True, sequence_end=True)
    finally:
        client.close()
    samples = scrape(server)
    after = value(samples, "inferd_sequences_released_total", reason="end", **labels)
    assert after - before == 2.0
    assert value(samples, "inferd_sequences_backlog", **labels) == 0.0


def test_a_sequence_field_inferd_does_not_honour_fails_the_load(server: RunningServer) -> None:
    rows = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
    (row,) = [r for r in rows if r["name"] == "bad_sequence"]
    assert row["state"] == "UNAVAILABLE"
    assert "bad_sequence/config.pbtxt: sequence_batching.oldest.preserve_ordering" in row["reason"]


def test_the_server_lists_the_sequence_extension(server: RunningServer) -> None:
    assert "sequence" in httpx.get(f"{server.url}/v2").json()["extensions"]
