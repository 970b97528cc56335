"""Reference files: each bad one is refused with the file's name and what is wrong; a good
one is prepared per tensor (numeric columns, BYTES lengths, predicted classes)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from inferd.config.model_config import ConfigError
from inferd.monitoring.drift_setup import DriftSetupError, monitor_for_load
from inferd.monitoring.drift_spec import DriftOptions, read_drift_options
from inferd.monitoring.reference import (
    ReferenceError,
    features,
    npz_bytes,
    parse_reference,
    read_reference_file,
    tensor_plans,
)

OPTIONS = DriftOptions(class_outputs=frozenset({"probs"}))
WHERE = "m/1/reference.npz"


def config() -> mc.ModelConfig:
    c = mc.ModelConfig(name="m", max_batch_size=8)
    c.input.add(name="x", data_type=mc.TYPE_FP32, dims=[4])
    c.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    c.output.add(name="probs", data_type=mc.TYPE_FP32, dims=[3])
    return c


def good() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(50, 4)),
        "text": np.array([["a b"], ["c d e"]] * 25, dtype="S"),
        "probs": rng.random((50, 3)),
    }


def parse(arrays: dict[str, np.ndarray]) -> None:
    parse_reference(npz_bytes(arrays), tensor_plans(config(), OPTIONS), OPTIONS, WHERE)


def test_a_good_reference_is_prepared_per_tensor() -> None:
    tensors = parse_reference(npz_bytes(good()), tensor_plans(config(), OPTIONS), OPTIONS, WHERE)
    assert tensors["x"].column_names == ("0", "1", "2", "3")
    assert tensors["text"].column_names == ("length", "tokens")
    assert tensors["probs"].classes is not None and tensors["probs"].rows == 50


# (what changes in the good arrays, words the error names beside the file)
BAD: list[tuple[dict[str, np.ndarray | None], list[str]]] = [
    ({"x": None}, ["input 'x' is missing"]),
    ({"x": np.zeros((50, 5))}, ["'x'", "5 values per row", "4", "column count"]),
    ({"x": np.zeros((50, 2, 2))}, []),  # 4 values per row, whatever the shape: accepted
    ({"x": np.array([["a"] * 4] * 50)}, ["'x'", "not numeric"]),
    ({"x": np.full((50, 4), np.nan)}, ["'x'", "NaN"]),
    ({"x": np.zeros((3, 4))}, ["'x'", "3 rows", "10 or more"]),
    ({"y": np.zeros((50, 4))}, ["'y'", "not an input or output"]),
    ({"text": np.zeros((50, 1))}, ["'text'", "BYTES", "dtype 'S' or 'U'"]),
]


@pytest.mark.parametrize(("change", "words"), BAD)
def test_each_bad_reference_names_the_file_and_the_problem(
    change: dict[str, np.ndarray | None], words: list[str]
) -> None:
    arrays = good()
    for name, array in change.items():
        if array is None:
            del arrays[name]
        else:
            arrays[name] = array
    if not words:
        parse(arrays)
        return
    with pytest.raises(ReferenceError) as info:
        parse(arrays)
    assert str(info.value).startswith(WHERE + ": ")
    for word in words:
        assert word in str(info.value)


def test_object_arrays_and_other_files_are_refused(tmp_path: Path) -> None:
    plans = tensor_plans(config(), OPTIONS)
    path = tmp_path / "reference.npz"
    np.savez(path, x=np.array([b"a"] * 20, dtype=object), allow_pickle=True)
    with pytest.raises(ReferenceError, match=r"^m/1/reference.npz: .*object arrays"):
        read_reference_file(path, plans, OPTIONS, WHERE)
    path.write_bytes(b"not a zip")
    with pytest.raises(ReferenceError, match=r"^m/1/reference.npz: not a readable .npz"):
        read_reference_file(path, plans, OPTIONS, WHERE)


def test_drift_reference_file_needs_the_file(tmp_path: Path) -> None:
    options = DriftOptions(reference="file")
    with pytest.raises(DriftSetupError, match="drift_reference is 'file' but m/1/reference.npz"):
        monitor_for_load("m", "1", config(), options, tmp_path)
    # Without the parameter, a version without the file is simply not monitored.
    assert monitor_for_load("m", "1", config(), DriftOptions(), tmp_path) is None


def test_class_outputs_are_argmax_of_scores_or_one_rounded_value() -> None:
    plans = tensor_plans(config(), OPTIONS)
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], np.float32)
    assert features(plans["probs"], scores, 2, 64).tolist() == [1, 0]
    one = tensor_plans(config(), DriftOptions(class_outputs=frozenset({"probs"})))["probs"]
    sigmoid = np.array([[0.2], [0.8], [0.5001]], np.float32)
    assert features(one, sigmoid, 3, 64).tolist() == [0, 1, 1]
    assert features(one, np.array([[3], [7]], np.int64), 2, 64).tolist() == [3, 7]


def test_without_scipy_a_model_asking_for_drift_fails_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "reference.npz").write_bytes(npz_bytes(good()))
    for module in ("scipy", "scipy.stats"):
        monkeypatch.setitem(sys.modules, module, None)  # what an absent package raises
    with pytest.raises(DriftSetupError, match=r"pip install 'inferd\[monitoring\]'"):
        monitor_for_load("m", "1", config(), OPTIONS, tmp_path)
    with pytest.raises(DriftSetupError, match="scipy is not installed"):
        monitor_for_load(
            "m", "1", config(), DriftOptions(reference="first", first_rows=10), tmp_path
        )
    # A model that asks for none loads as before.
    assert monitor_for_load("m", "1", config(), DriftOptions(reference="none"), tmp_path) is None


def test_an_ensemble_refuses_drift_parameters() -> None:
    ensemble = mc.ModelConfig(name="e", platform="ensemble")
    ensemble.parameters["drift_window"].string_value = "100"
    with pytest.raises(ConfigError, match=r"e/config.pbtxt: parameters.drift_window: an ensemble"):
        read_drift_options(ensemble)
    assert read_drift_options(mc.ModelConfig(name="e", platform="ensemble")) == DriftOptions()
