"""Inference over HTTP: every datatype, JSON and binary, with the real tritonclient."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.infer_samples import sample
from tests.support.models import ONNX_TYPES
from tests.support.servers import RunningServer


@pytest.fixture(scope="module")
def triton(server: RunningServer):  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=8)
    yield client
    client.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", list(ONNX_TYPES))
def test_every_datatype_round_trips(triton, datatype: str, binary: bool) -> None:  # type: ignore[no-untyped-def]
    data = sample(datatype, (3, 5))
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = triton.infer(f"identity_{datatype.lower()}", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == data.shape
    if datatype == "BYTES":
        # tritonclient hands JSON strings back as str, binary ones as bytes.
        as_bytes = [v.encode() if isinstance(v, str) else v for v in got.reshape(-1)]
        assert as_bytes == data.reshape(-1).tolist()
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


def test_binary_input_json_output_and_back(triton) -> None:  # type: ignore[no-untyped-def]
    data = sample("FP32", (2, 8), seed=3)
    inp = httpclient.InferInput("input", [2, 8], "FP32")
    inp.set_data_from_numpy(data, binary_data=True)
    as_json = triton.infer(
        "mlp", [inp], outputs=[httpclient.InferRequestedOutput("probabilities", binary_data=False)]
    )
    inp.set_data_from_numpy(data, binary_data=False)
    as_binary = triton.infer(
        "mlp", [inp], outputs=[httpclient.InferRequestedOutput("probabilities", binary_data=True)]
    )
    np.testing.assert_allclose(
        as_json.as_numpy("probabilities"), as_binary.as_numpy("probabilities"), rtol=1e-6
    )
    np.testing.assert_allclose(as_binary.as_numpy("probabilities").sum(axis=1), 1.0, rtol=1e-5)


def test_mlp_matches_onnxruntime_directly(triton, good_repository) -> None:  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    data = sample("FP32", (5, 8), seed=9)
    session = ort.InferenceSession(str(good_repository / "mlp" / "2" / "model.onnx"))
    expected_probs, expected_label = session.run(None, {"input": data})
    inp = httpclient.InferInput("input", [5, 8], "FP32")
    inp.set_data_from_numpy(data)
    result = triton.infer("mlp", [inp])
    np.testing.assert_array_equal(result.as_numpy("probabilities"), expected_probs)
    np.testing.assert_array_equal(result.as_numpy("label"), expected_label)


def test_unbatched_model(triton) -> None:  # type: ignore[no-untyped-def]
    data = sample("FP32", (2, 3), seed=1)
    inp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(triton.infer("fixed", [inp]).as_numpy("OUTPUT0"), data)


def test_python_model_multi_row(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    inp = httpclient.InferInput("IN", [2, 4], "FP32")
    inp.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
    result = client.infer("faulty", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(8).reshape(2, 4) * 2)
    client.close()


def test_async_infer_many_in_flight(triton) -> None:  # type: ignore[no-untyped-def]
    pending = []
    for i in range(16):
        inp = httpclient.InferInput("IN", [1, 3], "FP32")
        inp.set_data_from_numpy(np.full((1, 3), i, dtype=np.float32))
        pending.append((i, triton.async_infer("counter", [inp], request_id=str(i))))
    for i, handle in pending:
        result = handle.get_result()
        assert result.get_response()["id"] == str(i)
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.full((1, 3), i, np.float32))
