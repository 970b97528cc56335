"""The capture's parts on their own: the shard format round trip (BYTES included), the
writer's bounded queue (a full one drops and counts, never waits), the accuracy window,
and what counts as a class output."""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from inferd.datatypes import BF16
from inferd.errors import InferdError
from inferd.monitoring.accuracy import AccuracyWindow
from inferd.monitoring.capture_files import (
    CapturedRequest,
    load_capture,
    read_shard,
    shard_arrays,
    write_shard,
)
from inferd.monitoring.capture_settings import CaptureSettings
from inferd.monitoring.capture_writer import CaptureWriter, DropCounts
from inferd.monitoring.feedback import FeedbackIndex, Prediction, predicted_classes
from inferd.types import Tensor


def _request(i: int, inputs: list[Tensor], outputs: list[Tensor] | None = None) -> CapturedRequest:
    outputs = outputs or []
    nbytes = sum(t.data.nbytes for t in [*inputs, *outputs])
    return CapturedRequest(f"r{i}", 1000.0 + i, "m", "3", "http", inputs, outputs, nbytes)


def test_a_shard_loads_back_equal_bytes_and_numbers(tmp_path: Path) -> None:
    text = np.array([[b"a\x00", b""], [b"\xff\x00\x01", b"long " * 50]], dtype=object)
    numbers = np.arange(6, dtype=np.int16).reshape(2, 3)
    scores = np.linspace(0, 1, 4, dtype=np.float64).reshape(1, 4)
    halves = np.array([[1.5, -2.0]], dtype=BF16)
    requests = [
        _request(0, [Tensor("t", "BYTES", (2, 2), text)], [Tensor("s", "FP64", (1, 4), scores)]),
        _request(1, [Tensor("n", "INT16", (2, 3), numbers), Tensor("h", "BF16", (1, 2), halves)]),
    ]
    arrays, metas = shard_arrays(requests)
    assert [m["id"] for m in metas] == ["r0", "r1"]
    write_shard(tmp_path / "capture-1.npz", arrays)
    rows = list(read_shard(tmp_path / "capture-1.npz"))
    assert [r.id for r in rows] == ["r0", "r1"]
    assert rows[0].inputs["t"].tolist() == text.tolist()  # trailing NULs and all
    np.testing.assert_array_equal(rows[0].outputs["s"], scores)
    np.testing.assert_array_equal(rows[1].inputs["n"], numbers)
    assert rows[1].inputs["n"].dtype == np.int16
    assert rows[1].inputs["h"].dtype == BF16
    np.testing.assert_array_equal(rows[1].inputs["h"], halves)
    assert (rows[0].model, rows[0].version, rows[0].time) == ("m", "3", 1000.0)
    assert not list(tmp_path.glob("*.tmp")), "written under a temporary name, then renamed"
    assert [r.id for r in load_capture(tmp_path)] == ["r0", "r1"]


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Path) -> None:
    drops = DropCounts()
    writer = CaptureWriter(CaptureSettings(tmp_path, max_bytes=10_000), drops, queue_items=3)
    x = Tensor("x", "FP32", (1, 4), np.zeros((1, 4), np.float32))
    for i in range(5):  # not started: nothing takes from the queue
        writer.offer(_request(i, [x]))
    assert drops.snapshot() == {("m", "queue_full"): 2}
    big = Tensor("x", "FP32", (1, 4000), np.zeros((1, 4000), np.float32))
    writer.offer(_request(9, [big]))  # more than the whole bound
    assert drops.snapshot()[("m", "too_large")] == 1
    writer.start()
    assert writer.flush()
    writer.close()
    assert [r.id for r in load_capture(tmp_path)] == ["r0", "r1", "r2"]


def test_the_accuracy_window_holds_the_last_rows() -> None:
    window = AccuracyWindow(3)
    assert window.value is None
    window.record([True, False])
    assert window.counts == (1, 2)
    window.record([True, True, False])  # the first two leave
    assert window.counts == (2, 3)
    window.record([False, False, False])
    assert window.value == 0.0


@pytest.mark.parametrize(
    ("datatype", "data", "batched", "expected"),
    [
        ("FP32", np.array([[0.1, 0.7, 0.2], [0.9, 0.0, 0.1]], np.float32), True, [1, 0]),
        ("INT64", np.array([[2], [5]], np.int64), True, [2, 5]),
        ("INT32", np.array([3], np.int32), False, [3]),
        ("FP32", np.array([0.2, 0.8], np.float32), False, [1]),
        ("BYTES", np.array([[b"cat"], [b"dog"]], object), True, ["cat", "dog"]),
        ("FP32", np.array([[0.5], [0.1]], np.float32), True, None),  # one score per row
        ("INT64", np.array([[1, 2]], np.int64), True, None),
        ("FP32", np.zeros((0, 4), np.float32), True, None),
    ],
)
def test_class_outputs(datatype: str, data: np.ndarray, batched: bool, expected: object) -> None:
    classes, problem = predicted_classes(Tensor("o", datatype, data.shape, data), batched)
    assert classes == expected
    assert bool(problem) == (expected is None)


def test_a_group_of_alike_requests_is_one_array_per_tensor(tmp_path: Path) -> None:
    """Rows = samples: alike requests' tensors concatenated, others in groups of their own,
    and each request's own rows loaded back."""
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(rows, 4)).astype(np.float32) for rows in (1, 3, 2)]
    wide = rng.normal(size=(2, 6)).astype(np.float32)  # other dims past the first
    requests = [_request(i, [Tensor("x", "FP32", x.shape, x)]) for i, x in enumerate(xs)]
    requests.insert(1, _request(7, [Tensor("x", "FP32", wide.shape, wide)]))
    arrays, metas = shard_arrays(requests)
    assert [m["group"] for m in metas] == [0, 1, 0, 0]
    np.testing.assert_array_equal(arrays["0/in/x"], np.concatenate(xs))
    np.testing.assert_array_equal(arrays["1/in/x"], wide)
    write_shard(tmp_path / "capture-1.npz", arrays)
    rows = {r.id: r for r in read_shard(tmp_path / "capture-1.npz")}
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(rows[f"r{i}"].inputs["x"], x)
    np.testing.assert_array_equal(rows["r7"].inputs["x"], wide)


def test_forgetting_unloaded_versions_drops_their_feedback_and_their_models_drops() -> None:
    index = FeedbackIndex()
    index._pending["m"] = OrderedDict(
        (rid, Prediction(version, [1], "", (), time.monotonic() + 60, 10))
        for rid, version in (("a", "1"), ("b", "2"))
    )
    index._pending["gone"] = OrderedDict(a=Prediction("1", [1], "", (), 0.0, 10))
    for version in ("1", "2"):
        index.windows[("m", version)] = AccuracyWindow(10)
        index.counts[("m", version, "joined")] = 1
    index.counts[("m", "", "unknown_id")] = 1  # the model's, no version's
    drops = DropCounts()
    drops.add("m", "queue_full")
    drops.add("gone", "queue_full")

    def gone(model: str, version: str) -> bool:
        return model == "gone" or version == "1"

    index.forget(gone)
    drops.forget(gone)
    assert list(index._pending) == ["m"] and list(index._pending["m"]) == ["b"]
    assert list(index.windows) == [("m", "2")]
    assert sorted(index.counts) == [("m", "", "unknown_id"), ("m", "2", "joined")]
    assert drops.snapshot() == {("m", "queue_full"): 1}
    with pytest.raises(InferdError, match="its version unloaded"):
        index.join("m", {"id": "a", "label": 1})  # version 1's prediction went with it
