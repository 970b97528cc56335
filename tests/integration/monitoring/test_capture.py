"""Sampled capture (docs/capture.md): what a client sent and got back, loaded back from the
shards equal, over JSON, binary HTTP and gRPC; the size bound removes the oldest shards; a
directory that cannot be written drops and counts every capture while every request still
succeeds; a model that samples nothing captures nothing and adds no id; an input in shared
memory is captured as it was when served."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from inferd.monitoring.capture_files import load_capture, read_index, shards
from inferd.monitoring.capture_settings import CaptureSettings
from inferd.telemetry.request_log import input_fingerprint
from inferd.types import Tensor
from tests.support.capture_clients import PROTOCOL, WIRES, Client
from tests.support.metrics_scrape import scrape, value
from tests.support.monitoring_models import parameters, write_signed_model
from tests.support.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("capture_repo")
    write_signed_model(repo, "all", extra=parameters(capture_sample_rate=1))
    write_signed_model(repo, "none")
    write_signed_model(repo, "half", extra=parameters(capture_sample_rate=0.5))
    return repo


@pytest.fixture(scope="module")
def captured(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("captures")
    with run_server(repo, capture=CaptureSettings(directory)) as running:
        yield running


def _x(rng: np.random.Generator, rows: int) -> np.ndarray:
    return rng.normal(size=(rows, 4)).astype(np.float32)


@pytest.mark.parametrize("wire", WIRES)
def test_captures_load_back_equal_to_what_was_sent(captured: RunningServer, wire: str) -> None:
    rng = np.random.default_rng(len(wire))
    sent = {}
    with Client(wire, captured) as client:
        for i in range(6):
            x = _x(rng, 1 + i % 3)
            given = f"{wire}-{i}" if i % 2 else ""  # half with the client's id
            answer = client.infer("all", x, given)
            if given:
                assert answer.id == given
            assert answer.id, "a captured request's response carries its id"
            sent[answer.id] = (x, answer)
    assert captured.server.capture.flush()
    directory = captured.server.settings.capture.directory
    assert directory is not None
    rows = {r.id: r for r in load_capture(directory, model="all") if r.id in sent}
    assert rows.keys() == sent.keys()
    for request_id, (x, answer) in sent.items():
        row = rows[request_id]
        assert (row.model, row.version, row.protocol) == ("all", "1", PROTOCOL[wire])
        np.testing.assert_array_equal(row.inputs["x"], x)
        np.testing.assert_array_equal(row.outputs["y"], answer.y)
        np.testing.assert_array_equal(row.outputs["cls"], answer.cls)
        assert row.datatypes == {"x": "FP32", "y": "FP32", "cls": "INT64"}
        assert row.fingerprint == input_fingerprint([Tensor("x", "FP32", x.shape, x)])
        assert row.time > 0
    index = {line["id"]: line for line in read_index(directory)}
    for request_id, row in rows.items():
        assert index[request_id]["shard"] == row.shard
        assert index[request_id]["fingerprint"] == row.fingerprint


def test_a_model_that_samples_nothing_captures_nothing(captured: RunningServer) -> None:
    before = scrape(captured)
    with Client("json", captured) as client:
        answers = [client.infer("none", _x(np.random.default_rng(i), 1)) for i in range(5)]
    assert [a.id for a in answers] == [""] * 5  # as Triton: no id sent, none answered
    assert captured.server.capture.flush()
    directory = captured.server.settings.capture.directory
    assert directory is not None
    assert load_capture(directory, model="none") == []
    after = scrape(captured)
    assert value(after, "inferd_captured_total", model="none", version="1") == 0
    assert value(before, "inferd_captured_total", model="none", version="1") == 0


def test_a_sampled_share_is_what_the_counter_and_the_ids_say(captured: RunningServer) -> None:
    before = value(scrape(captured), "inferd_captured_total", model="half", version="1")
    with Client("grpc", captured) as client:
        answers = [client.infer("half", _x(np.random.default_rng(i), 1)) for i in range(40)]
    with_id = [a.id for a in answers if a.id]
    after = value(scrape(captured), "inferd_captured_total", model="half", version="1")
    assert after - before == len(with_id)
    assert 0 < len(with_id) < 40  # one in 2**40 runs sees all or none of 40 draws at 0.5
    assert captured.server.capture.flush()
    directory = captured.server.settings.capture.directory
    assert directory is not None
    assert {r.id for r in load_capture(directory, model="half")} >= set(with_id)


def test_the_size_bound_removes_the_oldest_shards(repo: Path, tmp_path: Path) -> None:
    bound = 16 * 1024  # shards of about 2 KiB: 1 KiB requests, a few per shard
    settings = CaptureSettings(tmp_path / "cap", max_bytes=bound)
    rng = np.random.default_rng(7)
    ids = []
    with run_server(repo, capture=settings) as running:
        with Client("binary", running) as client:
            for i in range(120):
                ids.append(client.infer("all", _x(rng, 8), f"r{i:03d}").id)
                if i % 8 == 7:
                    assert running.server.capture.flush()  # a shard per 8 requests or so
        assert running.server.capture.flush()
        samples = scrape(running)
    files = shards(settings.directory)  # type: ignore[arg-type]
    assert sum(p.stat().st_size for p in files) <= bound
    assert value(samples, "inferd_capture_shards_removed_total") > 0
    kept = [r.id for r in load_capture(settings.directory)]  # type: ignore[arg-type]
    assert kept, "the newest shards stay"
    assert kept == ids[-len(kept) :], "what is left is the newest captures, in order"
    indexed = {line["id"] for line in read_index(settings.directory)}  # type: ignore[arg-type]
    assert indexed == set(kept), "the index lists what is on disk, no more"


def test_an_unwritable_directory_drops_and_counts_and_every_request_succeeds(
    repo: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings = CaptureSettings(blocker / "captures")  # cannot be made, even by root
    with run_server(repo, capture=settings) as running:
        for wire in WIRES:
            with Client(wire, running) as client:
                for i in range(4):
                    answer = client.infer("all", _x(np.random.default_rng(i), 2))
                    assert answer.y.shape == (2, 4)
        assert running.server.capture.flush()
        samples = scrape(running)
    assert value(samples, "inferd_captured_total", model="all", version="1") == 12
    dropped = value(samples, "inferd_capture_dropped_total", model="all", reason="write_error")
    assert dropped == 12


def test_an_input_in_shared_memory_is_captured_as_it_was_when_served(
    captured: RunningServer,
) -> None:
    """The client may reuse its region once answered: the capture holds a copy, and an
    output placed in shared memory (the response carries no data for it) is left out."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    key = f"/inferd_capture_{uuid.uuid4().hex[:12]}"
    region = shm.create_shared_memory_region(key.lstrip("/"), key, 2 * x.nbytes)
    client = grpcclient.InferenceServerClient(captured.grpc_address)
    try:
        shm.set_shared_memory_region(region, [x])
        client.register_system_shared_memory("cap", key, 2 * x.nbytes)
        inp = grpcclient.InferInput("x", [2, 4], "FP32")
        inp.set_shared_memory("cap", x.nbytes)
        y = grpcclient.InferRequestedOutput("y")
        y.set_shared_memory("cap", x.nbytes, offset=x.nbytes)
        cls = grpcclient.InferRequestedOutput("cls")
        result = client.infer("all", [inp], outputs=[y, cls], request_id="in-shm")
        shm.set_shared_memory_region(region, [np.full_like(x, -1)])  # reused at once
        client.unregister_system_shared_memory("cap")
    finally:
        client.close()
        shm.destroy_shared_memory_region(region)
    assert captured.server.capture.flush()
    directory = captured.server.settings.capture.directory
    assert directory is not None
    row = next(r for r in load_capture(directory, model="all") if r.id == "in-shm")
    np.testing.assert_array_equal(row.inputs["x"], x)
    assert set(row.outputs) == {"cls"}
    np.testing.assert_array_equal(row.outputs["cls"], result.as_numpy("cls"))
